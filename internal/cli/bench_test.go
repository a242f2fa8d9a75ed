//go:build linux

package cli

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestBenchUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"bench", "fio"},
		{"bench", "sim", "--fraction", "1.5"},
		{"bench", "sim", "--rounds", "0"},
		{"bench", "sim", "--policy", "lru,nope"},
		{"bench", "nbd", "--rounds", "0"},
		{"bench", "nbd", "--parts", "plain,udp"},
		{"bench", "nbd", "--parts", ""},
		{"bench", "nbd", "--parts", "iscsi,iser"},
		{"bench", "cache", "--rounds", "0"},
		{"bench", "cache", "--slow-runtime", "500ms"},
		{"bench", "cache", "--parts", "slow,warm"},
		{"bench", "cache", "--parts", "reduction"},
		{"bench", "cache", "--image", "usr.ext4"},
		{"bench", "cache", "--parts", "checksums"},
		{"bench", "cache", "--baseline", "/tmp/tierblk-old"},
		{"bench", "cache", "--parts", "hits", "--baseline", "/tmp/tierblk-old"},
		{"bench", "writeback", "--rounds", "0"},
		{"bench", "writeback", "--runtime", "0s"},
		{"bench", "writeback", "--burst", ""},
		{"bench", "startup", "--rounds", "0"},
		{"bench", "startup", "--lines", ""},
		{"bench", "startup", "--lines", "1M,ten"},
		{"bench", "startup", "--lines", "0"},
		{"bench", "cold", "--rounds", "0"},
		{"bench", "cold", "--runtime", "500ms"},
		{"bench", "cold", "--slow-runtime", "0s"},
		{"bench", "cold", "--settle", "-1s"},
		{"bench", "cold", "--size", ""},
		{"bench", "cold", "--rows", "nas-read,warm"},
	} {
		root := NewRoot("test")
		var out bytes.Buffer
		root.SetOut(&out)
		root.SetErr(&out)
		root.SetArgs(args)
		err := root.Execute()
		require.Error(t, err, "%v", args)
		require.Equal(t, 2, ExitCode(err), "%v: %v", args, err)
	}
}

func TestBenchNBDParts(t *testing.T) {
	cmd := newBenchNBDCmd()
	require.Equal(t, "[plain,tls]", cmd.Flags().Lookup("parts").DefValue, "plain and tls unless told: iscsi needs root")
	require.NoError(t, cmd.Flags().Parse([]string{"--parts", "tls,iscsi"}))
	parts, err := cmd.Flags().GetStringSlice("parts")
	require.NoError(t, err)
	require.Equal(t, []string{"tls", "iscsi"}, parts)
	require.Contains(t, cmd.Long, "iscsi   not by default: needs root")
	require.Contains(t, cmd.Flags().Lookup("parts").Usage, "iscsi (against qemu-nbd")

	require.NoError(t, checkParts([]string{"tls", "plain"}, "plain", "tls"))
	require.NoError(t, checkParts([]string{"iscsi"}, "plain", "tls", "iscsi"))
	err = checkParts([]string{"plain", "udp"}, "plain", "tls", "iscsi")
	require.EqualError(t, err, `--parts: unknown part "udp"; parts: plain, tls, iscsi`)
	require.Equal(t, 2, ExitCode(err))
	require.EqualError(t, checkParts(nil, "slow", "hits"), "--parts is empty; parts: slow, hits")
}
