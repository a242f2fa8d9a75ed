package integration

// tierblk iscsi-ls against tgtd: SendTargets discovery lists every target, and each target's disk
// LUNs with their sizes, each line a --backend URL that opens.

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/pkg/backend"
	"github.com/tierblk/tierblk/pkg/backend/iscsi"
	"github.com/tierblk/tierblk/pkg/backend/registry"
)

func TestISCSILs(t *testing.T) {
	srv := startTGTD(t)
	u1, _ := srv.newLUN(t, 1<<20, lunOptions{})
	u2, _ := srv.newLUN(t, 3<<20, lunOptions{blockSize: 4096})

	code, out := runTierblk(t, "iscsi-ls", "iscsi://"+srv.Addr)
	require.Zero(t, code, out)
	t.Logf("tierblk iscsi-ls iscsi://%s:\n%s", srv.Addr, out)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 2, out)
	for i, want := range []struct{ url, size string }{{u1, "1MiB"}, {u2, "3MiB"}} {
		fields := strings.Split(lines[i], "\t")
		require.Len(t, fields, 3, lines[i])
		require.Equal(t, []string{want.url, want.size}, fields[:2], "the controller at LUN 0 is left out")
		require.Contains(t, fields[2], srv.Addr[strings.LastIndex(srv.Addr, ":"):], "a portal on tgtd's port")
		b, err := registry.Default().Open(fields[0], backend.Options{})
		require.NoError(t, err, "the listed URL opens")
		require.NoError(t, b.Close())
	}

	t.Run("connection refused", func(t *testing.T) {
		addr := freeTCPAddr(t)
		code, out := runTierblk(t, "iscsi-ls", "iscsi://"+addr)
		require.Equal(t, 1, code, out)
		require.Contains(t, out, "cannot reach "+addr)
		require.Contains(t, out, "connection refused")
	})

	t.Run("CHAP", func(t *testing.T) {
		u3, _ := srv.newLUN(t, 1<<20, lunOptions{user: "alice", password: "alice-secret-12"})
		t.Setenv(iscsi.EnvUser, "alice")
		t.Setenv(iscsi.EnvPassword, "wrong-secret-12")
		code, out := runTierblk(t, "iscsi-ls", "iscsi://"+srv.Addr)
		require.Equal(t, 1, code, out)
		require.Contains(t, out, strings.TrimSuffix(u3, "/1")+"/LUN\t?\t", "the target is still listed")
		require.Contains(t, out, `authentication failed: target `+u3[len("iscsi://"+srv.Addr)+1:len(u3)-2]+" at "+srv.Addr+` refused CHAP user "alice"`)
		require.NotContains(t, out, "wrong-secret-12")

		t.Setenv(iscsi.EnvPassword, "alice-secret-12")
		code, out = runTierblk(t, "iscsi-ls", "iscsi://"+srv.Addr)
		t.Logf("with alice's CHAP:\n%s", out)
		require.Equal(t, 1, code, "the first two targets do not take alice's CHAP:\n%s", out)
		require.Contains(t, out, u3+"\t1MiB\t")
	})
}
