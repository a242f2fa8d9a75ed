package config

import (
	"os"
	"path/filepath"
	"strconv"
)

// DefaultRunDir is the run directory (run_dir) of a daemon whose configuration names none: one on
// a tmpfs that the user running it may write, so that a daemon not run by root keeps its run logs
// (what makes a kill of it lose no index record) as root's does. Root's is /run/tierblk; another
// user's is tierblk under $XDG_RUNTIME_DIR, the per-user tmpfs a login session has, else
// /dev/shm/tierblk-UID (a tmpfs on every Linux; the daemon refuses it unless it is the user's own
// directory that no one else may write).
func DefaultRunDir() string { return defaultRunDir(os.Geteuid(), os.Getenv) }

func defaultRunDir(euid int, getenv func(string) string) string {
	switch xdg := getenv("XDG_RUNTIME_DIR"); {
	case euid == 0:
		return "/run/tierblk"
	case filepath.IsAbs(xdg):
		return filepath.Join(xdg, "tierblk")
	}
	return "/dev/shm/tierblk-" + strconv.Itoa(euid)
}
