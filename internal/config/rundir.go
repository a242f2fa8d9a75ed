package config

import (
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// systemRunDir is root's run directory, and that of any user it belongs to (a container image
// run as a user makes it that user's).
const systemRunDir = "/run/tierblk"

// DefaultRunDir is the run directory (run_dir) of a daemon whose configuration names none: one on
// a tmpfs that the user running it may write, so that a daemon not run by root keeps its run logs
// (what makes a kill of it lose no index record) as root's does. Root's is /run/tierblk, as is a
// user's whose own directory it is; another user's is tierblk under $XDG_RUNTIME_DIR, the
// per-user tmpfs a login session has, else /dev/shm/tierblk-UID (a tmpfs on every Linux; the
// daemon refuses it unless it is the user's own directory that no one else may write).
func DefaultRunDir() string { return defaultRunDir(os.Geteuid(), os.Getenv, ownerOf) }

func defaultRunDir(euid int, getenv func(string) string, owner func(string) (int, bool)) string {
	if uid, ok := owner(systemRunDir); euid == 0 || ok && uid == euid {
		return systemRunDir
	}
	if xdg := getenv("XDG_RUNTIME_DIR"); filepath.IsAbs(xdg) {
		return filepath.Join(xdg, "tierblk")
	}
	return "/dev/shm/tierblk-" + strconv.Itoa(euid)
}

// ownerOf is the uid of the directory at path, if there is one.
func ownerOf(path string) (int, bool) {
	fi, err := os.Stat(path)
	if err != nil || !fi.IsDir() {
		return 0, false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, false
	}
	return int(st.Uid), true
}
