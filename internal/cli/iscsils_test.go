package cli

import (
	"bytes"
	"context"
	"net"
	"testing"

	"github.com/stretchr/testify/require"
)

// The command's errors without a target: a SendTargets exchange is tested in pkg/backend/iscsi
// and against tgtd in integration/iscsils_test.go.
func TestISCSILsErrors(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	refused := l.Addr().String()
	require.NoError(t, l.Close())
	for _, c := range []struct {
		url   string
		usage bool
		want  string
	}{
		{"nas.local", true, "does not begin with iscsi://"},
		{"iscsi://nas.local/iqn.2026-01.test:a/1", true, "discovery takes a portal only"},
		{"iscsi://alice@nas.local", true, "has no password"},
		{"iscsi://" + refused, false, "cannot reach " + refused},
	} {
		t.Run(c.url, func(t *testing.T) {
			var out, errOut bytes.Buffer
			err := runISCSILs(context.Background(), &out, &errOut, c.url, func(string) string { return "" })
			require.ErrorContains(t, err, c.want)
			require.Equal(t, map[bool]int{true: 2, false: 1}[c.usage], ExitCode(err))
			require.Empty(t, out.String())
		})
	}
}
