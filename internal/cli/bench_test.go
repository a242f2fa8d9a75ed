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
		{"bench", "writeback", "--parts", "slow,ext4"},
		{"bench", "writeback", "--parts", "order", "--size", "1g"},
		{"bench", "writeback", "--parts", "order", "--order-writes", "10"},
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
