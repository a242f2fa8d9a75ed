package server

import (
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/nbd/nbdtest"
	"github.com/tierblk/tierblk/internal/nbd/proto"
	"github.com/tierblk/tierblk/internal/volume"
)

func TestAllowed(t *testing.T) {
	tcp := func(s string) net.Addr { return net.TCPAddrFromAddrPort(netip.MustParseAddrPort(s)) }
	prefixes := func(ss ...string) []netip.Prefix {
		var ps []netip.Prefix
		for _, s := range ss {
			ps = append(ps, netip.MustParsePrefix(s))
		}
		return ps
	}
	for _, tc := range []struct {
		name  string
		allow []netip.Prefix
		addr  net.Addr
		want  bool
	}{
		{"no list: anyone", nil, tcp("203.0.113.9:5000"), true},
		{"the one address", prefixes("127.0.0.1/32"), tcp("127.0.0.1:5000"), true},
		{"its neighbour", prefixes("127.0.0.1/32"), tcp("127.0.0.2:5000"), false},
		{"in a network", prefixes("10.0.0.0/8"), tcp("10.255.1.2:5000"), true},
		{"past a network", prefixes("10.0.0.0/8"), tcp("11.0.0.1:5000"), false},
		{"in the second network", prefixes("10.0.0.0/8", "192.168.1.0/24"), tcp("192.168.1.77:5000"), true},
		{"IPv4 client of a dual-stack listener", prefixes("10.0.0.0/8"), tcp("[::ffff:10.1.2.3]:5000"), true},
		{"IPv6 in a network", prefixes("fd00::/64"), tcp("[fd00::1]:5000"), true},
		{"IPv6 past a network", prefixes("fd00::/64"), tcp("[fd00:0:0:1::1]:5000"), false},
		{"IPv6 with a zone", prefixes("fe80::/10"), net.TCPAddrFromAddrPort(netip.AddrPortFrom(netip.MustParseAddr("fe80::1%eth0"), 5000)), true},
		{"IPv6 client, IPv4 list", prefixes("0.0.0.0/0"), tcp("[::1]:5000"), false},
		{"everyone, IPv4 and IPv6", prefixes("0.0.0.0/0", "::/0"), tcp("[2001:db8::1]:5000"), true},
		{"unix socket: not subject", prefixes("127.0.0.1/32"), &net.UnixAddr{Name: "/run/x.sock", Net: "unix"}, true},
		{"no address: not subject", prefixes("127.0.0.1/32"), nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, allowed(tc.allow, tc.addr))
		})
	}
}

// TestAllowList: a TCP client from an address in none of Allow is closed before the server sends
// it a byte, counted, and logged with its address; a client from an allowed address and a
// unix-socket client are served. Linux routes all of 127/8 to lo, so a client bound to 127.0.0.2
// stands for another host.
func TestAllowList(t *testing.T) {
	dev, _ := nbdtest.NewVolume(4096, 0, volume.Options{})
	logs := &nbdtest.Buffer{}
	ts := startServer(t, Config{Exports: []Export{{Device: dev}}, Allow: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")},
		Logger: slog.New(slog.NewTextHandler(logs, nil))})

	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}
	nc, err := d.Dial("tcp", ts.TCP)
	require.NoError(t, err)
	refused := nbdtest.NewRawClient(t, nc)
	n, err := io.Copy(io.Discard, refused.NC)
	if err != nil {
		require.ErrorIs(t, err, syscall.ECONNRESET)
	}
	require.Zero(t, n, "bytes sent to a client that is not allowed")
	require.Equal(t, map[string]uint64{"not allowed": 1, "too many connections": 0, "too many from one host": 0}, ts.s.RefusedConnections())
	require.Eventually(t, func() bool {
		for _, line := range strings.Split(logs.String(), "\n") {
			if strings.Contains(line, "level=WARN") && strings.Contains(line, "none of the allowed networks") &&
				strings.Contains(line, "remote="+nc.LocalAddr().String()) {
				return true
			}
		}
		return false
	}, 5*time.Second, 5*time.Millisecond, "a warning naming the refused client's address; the log:\n%s", logs)

	for _, network := range []string{"tcp", "unix"} {
		addr := map[string]string{"tcp": ts.TCP, "unix": ts.Sock}[network]
		c := nbdtest.DialRaw(t, network, addr)
		c.Connect("", false)
		c.Request(proto.Request{Type: proto.CmdFlush, Cookie: 1}, nil)
		require.Equal(t, nbdtest.Reply{Cookie: 1}, c.Reply(), network)
	}
	require.Equal(t, uint64(1), ts.s.RefusedConnections()["not allowed"])

	// A client that keeps trying is counted every time but logged about once a second.
	for range 20 {
		nc, err := d.Dial("tcp", ts.TCP)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, nc)
		nc.Close()
	}
	require.Eventually(t, func() bool { return ts.s.RefusedConnections()["not allowed"] == 21 }, 5*time.Second, 5*time.Millisecond)
	require.LessOrEqual(t, strings.Count(logs.String(), "none of the allowed networks"), 3, "warnings for 21 refusals in a burst:\n%s", logs)
}

// TestRefusalLogLimit: refusals of one reason log at most once per refusalLogEvery, the next
// warning saying how many were left out; each reason has its own limit.
func TestRefusalLogLimit(t *testing.T) {
	var l refusalLimiter
	t0 := time.Unix(1000, 0)
	for _, step := range []struct {
		why     Refusal
		at      time.Duration
		ok      bool
		skipped uint64
	}{
		{NotAllowed, 0, true, 0},
		{NotAllowed, 10 * time.Millisecond, false, 0},
		{NotAllowed, 500 * time.Millisecond, false, 0},
		{TooMany, 600 * time.Millisecond, true, 0},
		{NotAllowed, refusalLogEvery, true, 2},
		{NotAllowed, refusalLogEvery + time.Millisecond, false, 0},
		{NotAllowed, 3 * refusalLogEvery, true, 1},
	} {
		skipped, ok := l.allow(step.why, t0.Add(step.at))
		require.Equal(t, step.ok, ok, "%v at %v", step.why, step.at)
		require.Equal(t, step.skipped, skipped, "%v at %v", step.why, step.at)
	}
}
