package daemon

import (
	"fmt"
	"os"
	"syscall"
)

// prepareRunDir makes the run directory (config.RunDir) if it is missing and checks that it is
// the daemon's own: a directory, not a link, owned by the daemon's user and written by no one
// else. The run logs in it are replayed into the SSD tier's index at the next start, so a
// directory another user may write (a /dev/shm/tierblk-UID someone made first) would let them
// rewrite the cache's records.
func prepareRunDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	switch {
	case !fi.IsDir():
		return fmt.Errorf("run directory %s is not a directory (%s)", dir, fi.Mode().Type())
	case ok && int(st.Uid) != os.Geteuid():
		return fmt.Errorf("run directory %s belongs to uid %d, not to this daemon's user (uid %d); give --run-dir (run_dir) a directory of its own", dir, st.Uid, os.Geteuid())
	case fi.Mode().Perm()&0o022 != 0:
		return fmt.Errorf("run directory %s may be written by other users (mode %v); chmod go-w it, or give --run-dir (run_dir) a directory of this user's own", dir, fi.Mode().Perm())
	}
	return nil
}
