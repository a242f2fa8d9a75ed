//go:build linux

package cli

import (
	"testing"

	"github.com/stretchr/testify/require"
)

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
