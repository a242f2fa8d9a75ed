package daemon

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"strconv"

	"github.com/tierblk/tierblk/internal/config"
)

// socketAccess returns what gives each NBD unix socket's file the configured group and mode
// before it listens (listen.ListenUnix), or nil when neither is configured: the file then has the
// mode the umask leaves (0755 under the usual 022, which lets only the owner connect, since
// connecting needs write permission). The group is looked up once, before any socket is made.
// Errors are *config.Error, naming the setting.
func socketAccess(cfg config.Config) (func(path string) error, error) {
	if cfg.SocketMode == "" && cfg.SocketGroup == "" {
		return nil, nil
	}
	var mode fs.FileMode
	if cfg.SocketMode != "" {
		var err error
		if mode, err = config.ParseSocketMode(cfg.SocketMode); err != nil {
			return nil, &config.Error{Field: "socket_mode", Msg: err.Error()}
		}
	}
	gid := -1
	if cfg.SocketGroup != "" {
		var err error
		if gid, err = lookupGroup(cfg.SocketGroup); err != nil {
			return nil, &config.Error{Field: "socket_group", Msg: err.Error()}
		}
	}
	return func(path string) error {
		if gid >= 0 {
			if err := os.Chown(path, -1, gid); err != nil {
				msg := fmt.Sprintf("group %q: %v", cfg.SocketGroup, err)
				if errors.Is(err, os.ErrPermission) {
					msg += " (a daemon not run as root may give its socket only to a group it is a member of)"
				}
				return &config.Error{Field: "socket_group", Msg: msg}
			}
		}
		if cfg.SocketMode != "" {
			if err := os.Chmod(path, mode); err != nil {
				return &config.Error{Field: "socket_mode", Msg: err.Error()}
			}
		}
		return nil
	}, nil
}

// lookupGroup finds a group by name, or else takes it as a number, as chown(1) does. A binary
// built without cgo (as `make build` builds it) reads names from /etc/group only, not from other
// name services (LDAP, sssd); a number needs no lookup.
func lookupGroup(name string) (int, error) {
	g, err := user.LookupGroup(name)
	if err == nil {
		return strconv.Atoi(g.Gid)
	}
	if gid, nerr := strconv.ParseUint(name, 10, 31); nerr == nil {
		return int(gid), nil
	}
	var unknown user.UnknownGroupError
	if errors.As(err, &unknown) {
		return 0, fmt.Errorf("no group %q on this machine; give a group name from /etc/group or a numeric GID", name)
	}
	return 0, fmt.Errorf("group %q: %w", name, err)
}
