package daemon

import (
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/config"
)

// A clean stop's mark lets the next start take its device over once, and only with the same
// identity; without a mark, only an export without an SSD tier may be taken over.
func TestLeftMarks(t *testing.T) {
	old := LeftDir
	LeftDir = t.TempDir() + "/run"
	t.Cleanup(func() { LeftDir = old })

	require.False(t, takeLeft("/dev/nbd3", "tierblk:a"), "no mark")
	require.NoError(t, markLeft([]leftDevice{{"/dev/nbd3", "tierblk:a"}, {"/dev/nbd4", "tierblk:b"}}))
	require.False(t, takeLeft("/dev/nbd3", "tierblk:other"), "another identity")
	require.False(t, takeLeft("/dev/nbd3", "tierblk:a"), "a mark is read once")
	require.True(t, takeLeft("/dev/nbd4", "tierblk:b"))
	_, err := os.Stat(leftMark("/dev/nbd4"))
	require.ErrorIs(t, err, os.ErrNotExist)

	require.False(t, mayWriteBack(config.Export{}))
	require.False(t, mayWriteBack(config.Export{Cache: &config.Cache{RAM: "64MiB"}}))
	require.True(t, mayWriteBack(config.Export{Cache: &config.Cache{SSD: "/dev/vdb"}}))
}
