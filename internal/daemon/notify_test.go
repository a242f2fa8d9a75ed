package daemon

import (
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/config"
	"github.com/tierblk/tierblk/internal/systemd"
	"github.com/tierblk/tierblk/pkg/backend/registry"
)

// states records what the daemon tells the service manager, in order.
type states struct {
	mu   sync.Mutex
	list []string
}

func (s *states) notify(state string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.list = append(s.list, state)
	return nil
}

func (s *states) all() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.list...)
}

// index is the position of the first state containing sub, or -1.
func index(list []string, sub string) int {
	for i, s := range list {
		if strings.Contains(s, sub) {
			return i
		}
	}
	return -1
}

// TestActivatedNotified runs the daemon on a socket passed as socket activation passes one, and
// checks what it tells the service manager and in which order.
func TestActivatedNotified(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "activated.sock")
	l, err := net.Listen("unix", sock)
	require.NoError(t, err)
	l.(*net.UnixListener).SetUnlinkOnClose(false) // as one made from a passed descriptor
	activated := []systemd.Listener{{Listener: l, Name: "nbd"}}

	cfg := config.Defaults()
	cfg.Exports = []config.Export{{Name: "disk", Backend: "mem://1MiB"}}
	cfg.Listen = []string{"unix:" + filepath.Join(dir, "ignored.sock")}
	replaced := UseActivated(&cfg, activated)
	require.Equal(t, []string{"unix:" + filepath.Join(dir, "ignored.sock")}, replaced)
	require.Equal(t, []string{"unix:" + sock}, cfg.Listen)
	require.NoError(t, cfg.Validate(registry.Default().Schemes()))

	var st states
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan []string, 1)
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, cfg, registry.Default(), slog.New(slog.NewTextHandler(io.Discard, nil)), Options{
			Ready: func(a []string) { ready <- a }, Activated: activated, Notify: st.notify,
		})
	}()
	select {
	case a := <-ready:
		require.Equal(t, []string{sock}, a)
	case err := <-done:
		t.Fatalf("daemon did not start: %v", err)
	}
	// READY=1 was sent before Ready: a client connects at once.
	list := st.all()
	r := index(list, "READY=1")
	require.GreaterOrEqual(t, r, 0, "states: %q", list)
	require.Contains(t, list[r], "STATUS=serving 1 export on "+sock)
	require.Less(t, index(list, "STATUS=opening 1 export"), r, "states: %q", list)
	dial(t, sock, "disk").Close()
	_, err = os.Stat(filepath.Join(dir, "ignored.sock"))
	require.ErrorIs(t, err, os.ErrNotExist, "a listen address replaced by activation was opened")

	cancel()
	require.NoError(t, <-done)
	list = st.all()
	s := index(list, "STOPPING=1")
	require.Greater(t, s, r, "states: %q", list)
	require.Greater(t, index(list, "STATUS=stopping: flushing 1 export"), s, "states: %q", list)
	require.Equal(t, 1, strings.Count(strings.Join(list, "\n"), "READY=1"), "states: %q", list)
	_, err = os.Stat(sock)
	require.NoError(t, err, "the service manager's socket file must outlive the daemon")
}

func TestCheckActivated(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "a.sock")
	l, err := net.Listen("unix", sock)
	require.NoError(t, err)
	defer l.Close()
	require.NoError(t, os.Chmod(sock, 0o660))
	gid := os.Getgid()
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer tcp.Close()

	tests := []struct {
		name        string
		mode, group string
		ls          []net.Listener
		err         []string
	}{
		{name: "no settings", ls: []net.Listener{l}},
		{name: "mode matches", mode: "0660", ls: []net.Listener{l}},
		{name: "group matches", group: strconv.Itoa(gid), ls: []net.Listener{l}},
		{name: "mode differs", mode: "0600", ls: []net.Listener{l}, err: []string{"socket_mode", "0660", "SocketMode=0600"}},
		{name: "group differs", group: strconv.Itoa(gid + 1), ls: []net.Listener{l}, err: []string{"socket_group", "SocketGroup="}},
		{name: "tcp has no mode", mode: "0600", ls: []net.Listener{tcp}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := config.Defaults()
			cfg.SocketMode, cfg.SocketGroup = tt.mode, tt.group
			var ls []systemd.Listener
			for _, l := range tt.ls {
				ls = append(ls, systemd.Listener{Listener: l})
			}
			err := checkActivated(cfg, ls)
			if tt.err == nil {
				require.NoError(t, err)
				return
			}
			for _, m := range tt.err {
				require.ErrorContains(t, err, m)
			}
		})
	}
}

func TestWatchdog(t *testing.T) {
	tests := []struct {
		name  string
		hang  bool // the check never returns
		pings bool
	}{
		{name: "answering", pings: true},
		{name: "wedged", hang: true, pings: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var st states
			n := &notifier{send: st.notify, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
			block := make(chan struct{})
			defer close(block)
			var checks atomic.Int32
			check := func() {
				checks.Add(1)
				if tt.hang {
					<-block
				}
			}
			ctx, cancel := context.WithCancel(context.Background())
			wait := runWatchdog(ctx, 100*time.Millisecond, check, n, n.log)
			time.Sleep(600 * time.Millisecond)
			cancel()
			wait()
			pings := strings.Count(strings.Join(st.all(), "\n"), "WATCHDOG=1")
			if tt.pings {
				require.GreaterOrEqual(t, pings, 4, "pings every 50ms for 600ms")
			} else {
				require.Zero(t, pings)
				require.EqualValues(t, 1, checks.Load(), "a check that has not returned is not started again")
			}
		})
	}
}
