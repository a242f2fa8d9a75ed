package iscsi

import (
	"crypto/md5"
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
)

// CHAP (RFC 1994 as RFC 7143 section 12.1.3 uses it): the target sends an identifier and a
// challenge, the initiator answers MD5(identifier || secret || challenge) under its name. With
// mutual CHAP the initiator sends a challenge of its own in the same PDU and checks the target's
// answer. MD5 (CHAP_A=5) is the one algorithm every target has.

const (
	chapMD5 = "5"
	// chapChallengeLen is the length of our challenge for mutual CHAP: RFC 7143 asks for at least
	// the hash's length.
	chapChallengeLen = 16
	// maxChallengeLen bounds the target's challenge: 1024 bytes is RFC 7143's limit.
	maxChallengeLen = 1024
)

// chapResponse is the answer to the challenge with identifier id under secret.
func chapResponse(id byte, secret string, challenge []byte) []byte {
	h := md5.New()
	h.Write([]byte{id})
	h.Write([]byte(secret))
	h.Write(challenge)
	return h.Sum(nil)
}

// parseBinary decodes a binary value of a text key: 0x followed by hex, or 0b followed by base64
// (RFC 7143 section 6.1).
func parseBinary(v string) ([]byte, error) {
	switch {
	case len(v) > 2 && strings.EqualFold(v[:2], "0x"):
		s := v[2:]
		if len(s)%2 == 1 {
			s = "0" + s
		}
		return hex.DecodeString(s)
	case len(v) > 2 && strings.EqualFold(v[:2], "0b"):
		return base64.StdEncoding.DecodeString(v[2:])
	}
	return nil, fmt.Errorf("%q is neither 0x-hex nor 0b-base64", v)
}

func encodeHex(b []byte) string { return "0x" + hex.EncodeToString(b) }

// chapAnswer computes our CHAP keys for the target's CHAP_I and CHAP_C; with mutual set (the
// target's credentials), it adds our own identifier and challenge and returns what the target's
// answer must be.
func chapAnswer(ps map[string]string, own *secret, mutual *secret) (keys []pair, want []byte, err error) {
	idStr, chal := ps["CHAP_I"], ps["CHAP_C"]
	if idStr == "" || chal == "" {
		return nil, nil, fmt.Errorf("%w: CHAP: the target sent no CHAP_I or CHAP_C", ErrProtocol)
	}
	id, err := strconv.ParseUint(idStr, 10, 8)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: CHAP: CHAP_I=%s is not a number from 0 to 255", ErrProtocol, truncate([]byte(idStr)))
	}
	challenge, err := parseBinary(chal)
	if err != nil || len(challenge) == 0 || len(challenge) > maxChallengeLen {
		return nil, nil, fmt.Errorf("%w: CHAP: CHAP_C is not a challenge of 1 to %d bytes", ErrProtocol, maxChallengeLen)
	}
	keys = []pair{{"CHAP_N", own.user}, {"CHAP_R", encodeHex(chapResponse(byte(id), own.password, challenge))}}
	if mutual == nil {
		return keys, nil, nil
	}
	var b [1 + chapChallengeLen]byte
	for {
		_, _ = rand.Read(b[:]) // never fails (crypto/rand)
		// A target that sent our own challenge back would get our answer to replay.
		if subtle.ConstantTimeCompare(b[1:], challenge) == 0 {
			break
		}
	}
	keys = append(keys, pair{"CHAP_I", strconv.Itoa(int(b[0]))}, pair{"CHAP_C", encodeHex(b[1:])})
	return keys, chapResponse(b[0], mutual.password, b[1:]), nil
}

// checkTargetAnswer checks the target's CHAP_N and CHAP_R for mutual CHAP.
func checkTargetAnswer(ps map[string]string, mutual *secret, want []byte, target string) error {
	if ps["CHAP_N"] != mutual.user {
		return fmt.Errorf("%w: target %s answered mutual CHAP as %q, not %q", ErrAuthFailed, target, truncate([]byte(ps["CHAP_N"])), mutual.user)
	}
	got, err := parseBinary(ps["CHAP_R"])
	if err != nil || subtle.ConstantTimeCompare(got, want) != 1 {
		return fmt.Errorf("%w: target %s does not know the mutual CHAP secret of %q", ErrAuthFailed, target, mutual.user)
	}
	return nil
}
