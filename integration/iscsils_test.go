package integration

// tierblk iscsi-ls against tgtd: SendTargets discovery lists every target, each as a --backend
// URL that opens once its LUN is filled in.

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/pkg/backend"
	"github.com/tierblk/tierblk/pkg/backend/registry"
)

func TestISCSILs(t *testing.T) {
	srv := startTGTD(t)
	u1, _ := srv.newLUN(t, 1<<20, lunOptions{})
	u2, _ := srv.newLUN(t, 1<<20, lunOptions{})

	code, out := runTierblk(t, "iscsi-ls", "iscsi://"+srv.Addr)
	require.Zero(t, code, out)
	t.Logf("tierblk iscsi-ls iscsi://%s:\n%s", srv.Addr, out)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 2, out)
	for i, want := range []string{u1, u2} {
		url, portals, ok := strings.Cut(lines[i], "\t")
		require.True(t, ok, lines[i])
		require.Equal(t, strings.TrimSuffix(want, "/1")+"/LUN", url)
		require.Contains(t, portals, srv.Addr[strings.LastIndex(srv.Addr, ":"):], "a portal on tgtd's port")
		b, err := registry.Default().Open(strings.TrimSuffix(url, "LUN")+"1", backend.Options{})
		require.NoError(t, err, "the listed URL with its LUN opens")
		require.NoError(t, b.Close())
	}

	t.Run("connection refused", func(t *testing.T) {
		addr := freeTCPAddr(t)
		code, out := runTierblk(t, "iscsi-ls", "iscsi://"+addr)
		require.Equal(t, 1, code, out)
		require.Contains(t, out, "cannot reach "+addr)
		require.Contains(t, out, "connection refused")
	})
}
