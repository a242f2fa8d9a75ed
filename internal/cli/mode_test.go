package cli

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/cache"
)

func modeCmd(o actionOpts, mode string) (string, error) {
	var out bytes.Buffer
	o.stdout = &out
	err := runMode(context.Background(), o, mode)
	return out.String(), err
}

func TestModeLeavingWriteBackDrains(t *testing.T) {
	d := serveActions(t)
	out, err := modeCmd(actionOpts{admin: d.admin, export: "disk0"}, "writethrough")
	require.NoError(t, err)
	require.Contains(t, out, `export "disk0": mode writethrough`)
	require.Equal(t, cache.WriteThrough, d.cache.Mode())
	require.Zero(t, d.cache.Stats().Dirty.Lines)
	d.backendHoldsData(t)

	out, err = modeCmd(actionOpts{admin: d.admin}, "writeback")
	require.NoError(t, err)
	require.Equal(t, "the default export: mode writeback\n", out)
	require.Equal(t, cache.WriteBack, d.cache.Mode())
}

func TestModeArgs(t *testing.T) {
	for _, args := range [][]string{{"mode", "--admin", "127.0.0.1:1"}, {"mode", "--admin", "127.0.0.1:1", "writeback", "passthrough"}} {
		root := NewRoot("test")
		root.SetArgs(args)
		root.SetOut(&bytes.Buffer{})
		root.SetErr(&bytes.Buffer{})
		err := root.Execute()
		require.ErrorContains(t, err, "give one mode")
		require.Equal(t, 2, ExitCode(err))
	}
}
