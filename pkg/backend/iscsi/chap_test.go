package iscsi

import (
	"crypto/md5"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestCHAPResponse(t *testing.T) {
	challenge := []byte{1, 2, 3, 4}
	want := md5.Sum(append(append([]byte{7}, "secret"...), challenge...))
	require.Equal(t, want[:], chapResponse(7, "secret", challenge))
}

func TestParseBinary(t *testing.T) {
	for _, c := range []struct {
		in   string
		want []byte
		err  bool
	}{
		{in: "0x0102ff", want: []byte{1, 2, 0xff}},
		{in: "0X0A", want: []byte{10}},
		{in: "0x102", want: []byte{1, 2}}, // odd: a leading zero is implied
		{in: "0bAQID", want: []byte{1, 2, 3}},
		{in: "0x", err: true},
		{in: "0xzz", err: true},
		{in: "0b!!", err: true},
		{in: "123", err: true},
	} {
		got, err := parseBinary(c.in)
		if c.err {
			require.Error(t, err, c.in)
			continue
		}
		require.NoError(t, err, c.in)
		require.Equal(t, c.want, got, c.in)
	}
}

func TestCHAPAnswer(t *testing.T) {
	own := &secret{"alice", "alice-secret"}
	keys, want, err := chapAnswer(map[string]string{"CHAP_I": "9", "CHAP_C": "0x0a0b0c"}, own, nil)
	require.NoError(t, err)
	require.Nil(t, want)
	require.Equal(t, []pair{{"CHAP_N", "alice"}, {"CHAP_R", encodeHex(chapResponse(9, "alice-secret", []byte{10, 11, 12}))}}, keys)

	mutual := &secret{"tgt", "target-secret"}
	keys, want, err = chapAnswer(map[string]string{"CHAP_I": "9", "CHAP_C": "0x0a0b0c"}, own, mutual)
	require.NoError(t, err)
	ps := toMap(keys)
	id, err := parseNumber(ps["CHAP_I"])
	require.NoError(t, err)
	ourChallenge, err := parseBinary(ps["CHAP_C"])
	require.NoError(t, err)
	require.Len(t, ourChallenge, chapChallengeLen)
	require.Equal(t, chapResponse(byte(id), "target-secret", ourChallenge), want)

	good := map[string]string{"CHAP_N": "tgt", "CHAP_R": encodeHex(want)}
	require.NoError(t, checkTargetAnswer(good, mutual, want, "iqn.x:t"))
	for _, bad := range []map[string]string{
		{"CHAP_N": "other", "CHAP_R": encodeHex(want)},
		{"CHAP_N": "tgt", "CHAP_R": encodeHex(want[:15])},
		{"CHAP_N": "tgt", "CHAP_R": "0xnothex"},
		{"CHAP_N": "tgt"},
	} {
		err := checkTargetAnswer(bad, mutual, want, "iqn.x:t")
		require.ErrorIs(t, err, ErrAuthFailed, "%v", bad)
		require.NotContains(t, err.Error(), "target-secret")
	}

	for _, c := range []map[string]string{
		{"CHAP_C": "0x01"},
		{"CHAP_I": "1"},
		{"CHAP_I": "256", "CHAP_C": "0x01"},
		{"CHAP_I": "1", "CHAP_C": "0x"},
		{"CHAP_I": "1", "CHAP_C": "plain"},
	} {
		_, _, err := chapAnswer(c, own, nil)
		require.ErrorIs(t, err, ErrProtocol, "%v", c)
	}
}
