package daemon

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/config"
	"github.com/tierblk/tierblk/pkg/backend/registry"
)

// TestSocketAccess: the NBD unix sockets get socket_mode and socket_group, a TCP listener and the
// admin socket are left as they were, and a group that does not exist stops the start with an
// error naming the setting, before any socket is made.
func TestSocketAccess(t *testing.T) {
	dir := t.TempDir()
	nbd, admin := filepath.Join(dir, "nbd.sock"), filepath.Join(dir, "admin.sock")
	cfg := config.Defaults()
	cfg.Exports = []config.Export{{Backend: "mem://1MiB"}}
	cfg.Listen = []string{"unix:" + nbd, "127.0.0.1:0"}
	cfg.Admin = "unix:" + admin
	cfg.SocketMode = "0604" // an odd mode the umask never gives
	gid := otherGroup()
	cfg.SocketGroup = strconv.Itoa(gid)
	d := start(t, cfg)
	fi, err := os.Stat(nbd)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o604), fi.Mode().Perm())
	require.Equal(t, uint32(gid), fi.Sys().(*syscall.Stat_t).Gid)
	fi, err = os.Stat(admin)
	require.NoError(t, err)
	require.NotEqual(t, os.FileMode(0o604), fi.Mode().Perm(), "the admin socket is not an NBD socket")
	dial(t, nbd, "").Close()
	require.NoError(t, d.stop())
	require.NoFileExists(t, nbd)

	cfg.SocketGroup = "no-such-group-tierblk"
	require.NoError(t, cfg.Validate(registry.Default().Schemes()))
	err = Run(context.Background(), cfg, registry.Default(), slog.New(slog.NewTextHandler(io.Discard, nil)), Options{})
	require.ErrorContains(t, err, `socket_group: no group "no-such-group-tierblk" on this machine`)
	require.NoFileExists(t, nbd)
}

// otherGroup is a group other than the process's own that it may give a file to: any as root (a
// number needs no entry in /etc/group), else one of its supplementary groups, else its own.
func otherGroup() int {
	if os.Geteuid() == 0 {
		return 65534
	}
	gids, _ := os.Getgroups()
	for _, g := range gids {
		if g != os.Getegid() {
			return g
		}
	}
	return os.Getegid()
}
