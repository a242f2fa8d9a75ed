package meta

import (
	"os"
	"os/exec"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// killDirEnv tells a re-executed test binary to act as the process that is killed.
const killDirEnv = "TIERBLK_META_KILL_DIR"

const killLines = 500

// TestBadgerSurvivesProcessKill commits without sync in a child process that then dies by SIGKILL,
// without Close: every commit that returned must be there when the directory is reopened.
func TestBadgerSurvivesProcessKill(t *testing.T) {
	if dir := os.Getenv(killDirEnv); dir != "" {
		commitThenDie(t, dir)
		return
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestBadgerSurvivesProcessKill$", "-test.count=1")
	cmd.Env = append(os.Environ(), killDirEnv+"="+dir)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, "child: %s", out)
	status, _ := exit.Sys().(syscall.WaitStatus)
	require.True(t, status.Signaled() && status.Signal() == syscall.SIGKILL, "child did not die by SIGKILL: %v\n%s", err, out)

	b := openBadger(t, dir)
	defer b.Close()
	got := allLines(t, b)
	require.Len(t, got, killLines)
	for i, l := range got {
		require.Equal(t, Line{Line: uint64(i), Slot: uint32(i), Valid: []uint64{uint64(i)}}, l)
	}
}

func commitThenDie(t *testing.T, dir string) {
	b := openBadger(t, dir)
	for i := range uint64(killLines) {
		require.NoError(t, b.Commit([]Op{put(i, uint32(i), []uint64{i}, nil)}, false))
	}
	require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGKILL))
	select {} // the signal ends the process
}
