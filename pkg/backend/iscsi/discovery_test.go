package iscsi

import (
	"net"
	"testing"

	"github.com/stretchr/testify/require"
)

type discoverOutcome struct {
	targets []Target
	err     error
}

// startDiscover runs discover on its own goroutine against a fake target the test drives.
func startDiscover(t *testing.T) (chan discoverOutcome, *fakeTarget) {
	a, b := net.Pipe()
	t.Cleanup(func() { a.Close(); b.Close() })
	f := newFakeTarget(t, b)
	c := make(chan discoverOutcome, 1)
	go func() {
		cfg := config{addr: "pipe:3260"}
		targets, err := discover(a, &cfg, "pipe:3260", "iqn.2026-01.test:initiator", [6]byte{0x80, 1, 2, 3, 4, 5})
		c <- discoverOutcome{targets, err}
	}()
	return c, f
}

// discoveryLogin answers a discovery login without authentication.
func (f *fakeTarget) discoveryLogin() {
	f.t.Helper()
	req, keys := f.recvLogin()
	require.Equal(f.t, map[string]string{"InitiatorName": "iqn.2026-01.test:initiator", "SessionType": "Discovery", "AuthMethod": "None"}, keys)
	f.loginReply(req, true, stageOperational, 0, 0, pair{"AuthMethod", "None"})
	req, _ = f.recvLogin()
	f.loginReply(req, true, stageFullFeature, 0, 0, pair{"HeaderDigest", "None"}, pair{"DataDigest", "None"})
}

// textReply answers a Text Request with data; not final, it continues under tag ttt.
func (f *fakeTarget) textReply(req bhs, final bool, ttt uint32, data []byte) {
	f.t.Helper()
	h := reply(opTextResp, flagFinal, req)
	if !final {
		h[1] = flagContinue
	}
	h.setTTT(ttt)
	f.sendStatus(h, data)
}

func TestDiscover(t *testing.T) {
	text := appendText(nil,
		pair{"TargetName", "iqn.2026-01.test:a"}, pair{"TargetAddress", "192.0.2.1:3260,1"}, pair{"TargetAddress", "[2001:db8::1]:3260,1"},
		pair{"TargetName", "iqn.2026-01.test:b"}, pair{"TargetAddress", "192.0.2.1:3261,2"})
	want := []Target{
		{"iqn.2026-01.test:a", []string{"192.0.2.1:3260,1", "[2001:db8::1]:3260,1"}},
		{"iqn.2026-01.test:b", []string{"192.0.2.1:3261,2"}},
	}
	for _, c := range []struct {
		name  string
		split int // where the answer is cut in two PDUs; 0: one PDU
	}{{"one PDU", 0}, {"split inside a key", 50}, {"split at a NUL", len("TargetName=iqn.2026-01.test:a") + 1}} {
		t.Run(c.name, func(t *testing.T) {
			out, f := startDiscover(t)
			f.discoveryLogin()
			req, d := f.recvOp(opTextReq)
			require.Equal(t, "SendTargets=All\x00", string(d))
			require.Equal(t, uint32(reservedTag), req.ttt())
			require.NotZero(t, req.flags()&flagFinal)
			if c.split > 0 {
				f.textReply(req, false, 0x77, text[:c.split])
				req, d = f.recvOp(opTextReq)
				require.Empty(t, d, "asking for the rest")
				require.Equal(t, uint32(0x77), req.ttt())
				f.textReply(req, true, reservedTag, text[c.split:])
			} else {
				f.textReply(req, true, reservedTag, text)
			}
			req, _ = f.recvOp(opLogoutReq)
			f.sendStatus(reply(opLogoutResp, flagFinal, req), nil)
			o := <-out
			require.NoError(t, o.err)
			require.Equal(t, want, o.targets)
		})
	}
}

func TestDiscoverErrors(t *testing.T) {
	for _, c := range []struct {
		name string
		data []byte
		ttt  uint32
		want string
	}{
		{"address before name", appendText(nil, pair{"TargetAddress", "192.0.2.1:3260,1"}), reservedTag, "before any TargetName"},
		{"bad name", appendText(nil, pair{"TargetName", "disk"}), reservedTag, `TargetName "disk"`},
		{"bad address", appendText(nil, pair{"TargetName", "iqn.2026-01.test:a"}, pair{"TargetAddress", "host:99999"}), reservedTag, "no valid port"},
		{"no NUL", []byte("TargetName=iqn.2026-01.test:a"), reservedTag, "does not end with a NUL"},
		{"final with a tag", nil, 5, "text response from pipe:3260 with flags"},
	} {
		t.Run(c.name, func(t *testing.T) {
			out, f := startDiscover(t)
			f.discoveryLogin()
			req, _ := f.recvOp(opTextReq)
			f.textReply(req, true, c.ttt, c.data)
			o := <-out
			require.ErrorIs(t, o.err, ErrProtocol)
			require.ErrorContains(t, o.err, c.want)
		})
	}
}

func TestParseDiscoveryConfig(t *testing.T) {
	env := func(string) string { return "" }
	for _, c := range []struct {
		url, addr, user, err string
	}{
		{"iscsi://nas.local", "nas.local:3260", "", ""},
		{"iscsi://alice%pw@nas.local:3261/", "nas.local:3261", "alice", ""},
		{"iscsi://nas.local/iqn.2026-01.test:a/1", "", "", "discovery takes a portal only"},
		{"iscsi://alice@nas.local", "", "", "has no password"},
	} {
		u, err := ParseURL(c.url)
		require.NoError(t, err)
		cfg, err := parseDiscoveryConfig(u, env)
		if c.err != "" {
			require.ErrorContains(t, err, c.err, c.url)
			continue
		}
		require.NoError(t, err, c.url)
		require.Equal(t, c.addr, cfg.addr)
		if c.user != "" {
			require.Equal(t, c.user, cfg.chap.user)
		}
	}
}
