package iscsi

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/pkg/backend"
)

const testTarget = "iqn.2026-01.test:disk"

type loginOutcome struct {
	res *loginResult
	err error
}

// startLogin runs login on its own goroutine against a fake target the test drives.
func startLogin(t *testing.T, cfg config) (chan loginOutcome, *fakeTarget) {
	a, b := net.Pipe()
	t.Cleanup(func() { a.Close(); b.Close() })
	f := newFakeTarget(t, b)
	c := make(chan loginOutcome, 1)
	go func() {
		res, err := login(a, &cfg, "pipe:3260", "iqn.2026-01.test:initiator", [6]byte{0x80, 1, 2, 3, 4, 5})
		c <- loginOutcome{res, err}
	}()
	return c, f
}

func waitLogin(t *testing.T, c chan loginOutcome) loginOutcome {
	t.Helper()
	select {
	case o := <-c:
		return o
	case <-time.After(5 * time.Second):
		t.Fatal("login did not end")
		return loginOutcome{}
	}
}

// recvLogin reads a Login Request and its keys.
func (f *fakeTarget) recvLogin() (bhs, map[string]string) {
	f.t.Helper()
	h, d := f.recvOp(opLoginReq)
	ps, err := parseText(d)
	require.NoError(f.t, err)
	return h, toMap(ps)
}

// loginReply answers req: moving to stage nsg when transit, in status class and detail, with keys.
func (f *fakeTarget) loginReply(req bhs, transit bool, nsg, class, detail byte, keys ...pair) {
	f.t.Helper()
	f.loginReplyData(req, transit, false, nsg, class, detail, appendText(nil, keys...))
}

func (f *fakeTarget) loginReplyData(req bhs, transit, cont bool, nsg, class, detail byte, data []byte) {
	f.t.Helper()
	var h bhs
	h.setOpcode(opLoginResp, false)
	h[1] = req[1] & 0x0c // CSG
	if transit {
		h[1] |= flagTransit | nsg
		if nsg == stageFullFeature {
			binary.BigEndian.PutUint16(h[14:], 0x1234) // TSIH
		}
	}
	if cont {
		h[1] |= flagContinue
	}
	copy(h[8:14], req[8:14])
	h.setITT(req.itt())
	h[36], h[37] = class, detail
	f.sendStatus(h, data)
}

func stageOf(h bhs) (csg, nsg byte, transit bool) {
	return h[1] >> 2 & 3, h[1] & 3, h[1]&flagTransit != 0
}

// tgtdAnswers are what tgtd answers to our operational offer.
var tgtdAnswers = []pair{
	{"HeaderDigest", "None"}, {"DataDigest", "None"}, {"InitialR2T", "Yes"}, {"ImmediateData", "Yes"},
	{"MaxRecvDataSegmentLength", "8192"}, {"MaxBurstLength", "262144"}, {"FirstBurstLength", "65536"},
	{"MaxOutstandingR2T", "1"}, {"ErrorRecoveryLevel", "0"},
}

func TestLoginNoAuth(t *testing.T) {
	c, f := startLogin(t, config{target: testTarget})
	req, keys := f.recvLogin()
	require.Equal(t, byte(opLoginReq|bitImmediate), req[0])
	csg, nsg, transit := stageOf(req)
	require.Equal(t, []any{byte(stageSecurity), byte(stageOperational), true}, []any{csg, nsg, transit})
	require.Equal(t, []byte{0x80, 1, 2, 3, 4, 5, 0, 0}, req[8:16], "ISID, TSIH 0")
	require.Equal(t, map[string]string{"InitiatorName": "iqn.2026-01.test:initiator", "SessionType": "Normal",
		"TargetName": testTarget, "AuthMethod": "None"}, keys)
	require.Equal(t, uint32(1), req.u32(24), "CmdSN")
	f.loginReply(req, true, stageOperational, 0, 0, pair{"AuthMethod", "None"}, pair{"TargetPortalGroupTag", "1"})

	req, keys = f.recvLogin()
	csg, nsg, transit = stageOf(req)
	require.Equal(t, []any{byte(stageOperational), byte(stageFullFeature), true}, []any{csg, nsg, transit})
	require.Equal(t, uint32(1), req.u32(24), "CmdSN, not advanced by login")
	require.Equal(t, uint32(101), req.u32(28), "ExpStatSN")
	require.Equal(t, "0", keys["ErrorRecoveryLevel"])
	require.Equal(t, "No", keys["InitialR2T"])
	// The answer comes in two PDUs (C bit) and offers a key of the target's own, so the stage
	// takes another round.
	text := appendText(nil, append(tgtdAnswers, pair{"X-com.example.Tuning", "7"})...)
	f.loginReplyData(req, false, true, 0, 0, 0, text[:40])
	req, keys = f.recvLogin()
	require.Empty(t, keys, "asking for the rest of the text")
	require.Zero(t, req.flags()&(flagTransit|flagContinue))
	f.loginReplyData(req, false, false, 0, 0, 0, text[40:])
	req, keys = f.recvLogin()
	require.Equal(t, map[string]string{"X-com.example.Tuning": "NotUnderstood"}, keys)
	_, _, transit = stageOf(req)
	require.True(t, transit)
	f.expCmdSN, f.maxCmdSN = 1, 64
	f.loginReply(req, true, stageFullFeature, 0, 0)

	o := waitLogin(t, c)
	require.NoError(t, o.err)
	require.Equal(t, loginResult{
		params: params{maxRecvData: ourMaxRecvData, maxSendData: 8192, maxBurst: 262144, firstBurst: 65536,
			initialR2T: true, immediateData: true, maxOutstandingR2T: 1},
		cmdSN: 1, expCmdSN: 1, maxCmdSN: 64, expStatSN: 104, // four responses, StatSN 100 to 103
	}, *o.res)
}

// chapExchange plays the target's side of CHAP up to the initiator's response, which it checks,
// and returns that last request.
func chapExchange(t *testing.T, f *fakeTarget, own *secret) (req bhs, keys map[string]string) {
	req, keys = f.recvLogin()
	require.Equal(t, "CHAP", keys["AuthMethod"])
	_, _, transit := stageOf(req)
	require.False(t, transit)
	f.loginReply(req, false, 0, 0, 0, pair{"AuthMethod", "CHAP"})
	req, keys = f.recvLogin()
	require.Equal(t, map[string]string{"CHAP_A": "5"}, keys)
	challenge := []byte("a challenge of some length")
	f.loginReply(req, false, 0, 0, 0, pair{"CHAP_A", "5"}, pair{"CHAP_I", "42"}, pair{"CHAP_C", encodeHex(challenge)})
	req, keys = f.recvLogin()
	_, _, transit = stageOf(req)
	require.True(t, transit)
	require.Equal(t, own.user, keys["CHAP_N"])
	require.Equal(t, encodeHex(chapResponse(42, own.password, challenge)), keys["CHAP_R"])
	return req, keys
}

func TestLoginCHAP(t *testing.T) {
	own := &secret{"alice", "alice-secret"}
	t.Run("one-way", func(t *testing.T) {
		c, f := startLogin(t, config{target: testTarget, chap: own})
		req, keys := chapExchange(t, f, own)
		require.NotContains(t, keys, "CHAP_C", "no challenge of ours without mutual CHAP")
		f.loginReply(req, true, stageOperational, 0, 0)
		req, _ = f.recvLogin()
		f.loginReply(req, true, stageFullFeature, 0, 0, tgtdAnswers...)
		require.NoError(t, waitLogin(t, c).err)
	})
	mutual := &secret{"target1", "target-secret"}
	for _, c := range []struct {
		name   string
		answer func(keys map[string]string) []pair
		err    string
	}{
		{name: "mutual", answer: func(keys map[string]string) []pair {
			id, _ := parseNumber(keys["CHAP_I"])
			ch, _ := parseBinary(keys["CHAP_C"])
			return []pair{{"CHAP_N", "target1"}, {"CHAP_R", encodeHex(chapResponse(byte(id), "target-secret", ch))}}
		}},
		{name: "mutual, target without the secret", answer: func(keys map[string]string) []pair {
			id, _ := parseNumber(keys["CHAP_I"])
			ch, _ := parseBinary(keys["CHAP_C"])
			return []pair{{"CHAP_N", "target1"}, {"CHAP_R", encodeHex(chapResponse(byte(id), "guess", ch))}}
		}, err: `does not know the mutual CHAP secret of "target1"`},
		{name: "mutual, target that does not answer", answer: func(map[string]string) []pair { return nil },
			err: "ended the security stage without answering our mutual CHAP challenge"},
	} {
		t.Run(c.name, func(t *testing.T) {
			done, f := startLogin(t, config{target: testTarget, chap: own, targetCHAP: mutual})
			req, keys := chapExchange(t, f, own)
			f.loginReply(req, true, stageOperational, 0, 0, c.answer(keys)...)
			if c.err != "" {
				o := waitLogin(t, done)
				require.ErrorIs(t, o.err, ErrAuthFailed)
				require.ErrorContains(t, o.err, c.err)
				require.NotContains(t, o.err.Error(), "target-secret")
				return
			}
			req, _ = f.recvLogin()
			f.loginReply(req, true, stageFullFeature, 0, 0, tgtdAnswers...)
			require.NoError(t, waitLogin(t, done).err)
		})
	}
}

// A Login Response with a failure status is explained; the CHAP secret is never shown.
func TestLoginStatus(t *testing.T) {
	own := &secret{"alice", "alice-secret"}
	for _, c := range []struct {
		class, detail byte
		chap          *secret
		keys          []pair
		auth          bool
		redirect      string
		err           string
	}{
		{class: 2, detail: 1, chap: own, auth: true, err: `target iqn.2026-01.test:disk at pipe:3260 refused CHAP user "alice": wrong secret`},
		{class: 2, detail: 1, auth: true, err: "asks for authentication (AuthMethod=CHAP); set TIERBLK_ISCSI_USER and TIERBLK_ISCSI_PASSWORD"},
		{class: 2, detail: 2, auth: true, err: "does not let initiator iqn.2026-01.test:initiator in (authorization failure: check its ACL)"},
		{class: 2, detail: 3, err: "login to pipe:3260: target iqn.2026-01.test:disk not found (check the IQN in the URL)"},
		{class: 2, detail: 6, err: "failed: too many connections (status class 2, detail 0x06)"},
		{class: 3, detail: 1, err: "failed: service unavailable (status class 3, detail 0x01)"},
		{class: 3, detail: 9, err: "failed: unknown status (status class 3, detail 0x09)"},
		{class: 1, detail: 1, keys: []pair{{"TargetAddress", "10.0.0.9:3261,1"}}, redirect: "10.0.0.9:3261"},
		{class: 1, detail: 2, keys: []pair{{"TargetAddress", "[fe80::2]"}}, redirect: "[fe80::2]:3260"},
		{class: 1, detail: 1, err: "redirects the login without a usable TargetAddress"},
		{class: 1, detail: 1, keys: []pair{{"TargetAddress", "host:99999"}}, err: "without a usable TargetAddress"},
	} {
		done, f := startLogin(t, config{target: testTarget, chap: c.chap})
		req, _ := f.recvLogin()
		f.loginReply(req, false, 0, c.class, c.detail, c.keys...)
		o := waitLogin(t, done)
		if c.redirect != "" {
			var r *redirectError
			require.ErrorAs(t, o.err, &r)
			require.Equal(t, c.redirect, r.addr)
			continue
		}
		require.ErrorContains(t, o.err, c.err)
		require.Equal(t, c.auth, errors.Is(o.err, ErrAuthFailed), c.err)
		require.NotContains(t, o.err.Error(), "alice-secret")
	}
}

// A target that breaks the login's rules gets an error saying how.
func TestLoginProtocolErrors(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  config
		act  func(f *fakeTarget)
		err  string
	}{
		{name: "Reject", act: func(f *fakeTarget) {
			req, _ := f.recvLogin()
			h := reply(opReject, flagFinal, bhs{})
			h[2] = 0x04
			f.sendStatus(h, req[:])
		}, err: "rejected our login request (reason 0x04)"},
		{name: "not a Login Response", act: func(f *fakeTarget) {
			req, _ := f.recvLogin()
			f.sendStatus(reply(opNOPIn, flagFinal, req), nil)
		}, err: "NOP-In (ITT 0x1, DataSegmentLength 0) during login to pipe:3260"},
		{name: "wrong ITT", act: func(f *fakeTarget) {
			req, _ := f.recvLogin()
			req.setITT(77)
			f.loginReply(req, true, stageOperational, 0, 0)
		}, err: "login response for ITT 0x4d, sent 0x1"},
		{name: "wrong version", act: func(f *fakeTarget) {
			req, _ := f.recvLogin()
			var h bhs
			h.setOpcode(opLoginResp, false)
			h.setITT(req.itt())
			h[3] = 2
			f.sendStatus(h, nil)
		}, err: "speaks iSCSI version 2, not 0"},
		{name: "wrong stage", act: func(f *fakeTarget) {
			req, _ := f.recvLogin()
			req[1] = stageOperational << 2
			f.loginReply(req, true, stageFullFeature, 0, 0)
		}, err: "login response in stage 1 to a request in stage 0"},
		{name: "skips a stage", act: func(f *fakeTarget) {
			req, _ := f.recvLogin()
			f.loginReply(req, true, stageFullFeature, 0, 0)
		}, err: "target moved to login stage 3, we asked for 1"},
		{name: "never moves on", act: func(f *fakeTarget) {
			for range maxLoginRounds {
				req, _ := f.recvLogin()
				f.loginReply(req, false, 0, 0, 0)
			}
		}, err: "did not leave login stage 0 after 16 requests"},
		{name: "endless text", act: func(f *fakeTarget) {
			chunk := bytes.Repeat([]byte("k"), loginMaxData)
			for range maxTextLen/loginMaxData + 1 {
				req, _ := f.recvLogin()
				f.loginReplyData(req, false, true, 0, 0, 0, chunk)
			}
		}, err: "login text over 65536 bytes"},
		{name: "text without a NUL", act: func(f *fakeTarget) {
			req, _ := f.recvLogin()
			f.loginReplyData(req, true, false, stageOperational, 0, 0, []byte("AuthMethod=None"))
		}, err: `text "AuthMethod=None" does not end with a NUL`},
		{name: "CHAP asked of an initiator without credentials", act: func(f *fakeTarget) {
			req, _ := f.recvLogin()
			f.loginReply(req, false, 0, 0, 0, pair{"AuthMethod", "CHAP"})
		}, err: "asks for authentication (AuthMethod=CHAP)"},
		{name: "no CHAP for an initiator with credentials", cfg: config{chap: &secret{"u", "p"}}, act: func(f *fakeTarget) {
			req, _ := f.recvLogin()
			f.loginReply(req, false, 0, 0, 0, pair{"AuthMethod", "Reject"})
		}, err: "answered AuthMethod=Reject to CHAP"},
		{name: "another CHAP algorithm", cfg: config{chap: &secret{"u", "p"}}, act: func(f *fakeTarget) {
			req, _ := f.recvLogin()
			f.loginReply(req, false, 0, 0, 0, pair{"AuthMethod", "CHAP"})
			req, _ = f.recvLogin()
			f.loginReply(req, false, 0, 0, 0, pair{"CHAP_A", "7"})
		}, err: "answered CHAP_A=7 to CHAP_A=5"},
		{name: "oversized data segment", act: func(f *fakeTarget) {
			req, _ := f.recvLogin()
			var h bhs
			h.setOpcode(opLoginResp, false)
			h.setITT(req.itt())
			h.setDataLen(loginMaxData + 1)
			f.raw(h[:])
		}, err: "8193 bytes, limit 8192"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := c.cfg
			cfg.target = testTarget
			done, f := startLogin(t, cfg)
			c.act(f)
			o := waitLogin(t, done)
			require.ErrorContains(t, o.err, c.err)
		})
	}
}

func TestParseTargetAddress(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"10.0.0.9:3261,1", "10.0.0.9:3261"},
		{"10.0.0.9", "10.0.0.9:3260"},
		{"nas.example:3260", "nas.example:3260"},
		{"[fe80::1]:3262,2", "[fe80::1]:3262"},
		{"[fe80::1]", "[fe80::1]:3260"},
		{"[fe80::1],3", "[fe80::1]:3260"},
		{"", ""},
		{":3260", ""},
		{"host:0", ""},
		{"host:x", ""},
	} {
		got, err := parseTargetAddress(c.in)
		if c.want == "" {
			require.Error(t, err, c.in)
			continue
		}
		require.NoError(t, err, c.in)
		require.Equal(t, c.want, got, c.in)
	}
}

// dial follows a redirect to the address the target names.
func TestDialFollowsRedirect(t *testing.T) {
	first, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer first.Close()
	second, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer second.Close()
	done := make(chan error, 1)
	go func() {
		_, err := dial(config{addr: first.Addr().String(), target: testTarget}, backend.Options{Logger: testLog}, quietTiming)
		done <- err
	}()
	for i, l := range []net.Listener{first, second} {
		conn, err := l.Accept()
		require.NoError(t, err)
		defer conn.Close()
		f := newFakeTarget(t, conn)
		req, _ := f.recvLogin()
		if i == 0 {
			f.loginReply(req, false, 0, 1, 1, pair{"TargetAddress", second.Addr().String() + ",1"})
		} else {
			f.loginReply(req, false, 0, 2, 3)
		}
	}
	require.ErrorContains(t, <-done, "login to "+second.Addr().String()+": target iqn.2026-01.test:disk not found")
}
