package tlsconf

import (
	"crypto/tls"
	"sync/atomic"
)

// Reloadable is a configuration that can be loaded again (the daemon does on SIGHUP, when
// certificates were renewed): Config returns the latest that loaded, so that each new session
// takes it, while sessions already on keep theirs.
type Reloadable struct {
	load func() (*tls.Config, error)
	cur  atomic.Pointer[tls.Config]
}

// NewReloadable loads a configuration with load, which Reload calls again.
func NewReloadable(load func() (*tls.Config, error)) (*Reloadable, error) {
	r := &Reloadable{load: load}
	return r, r.Reload()
}

// Reload loads the configuration again. On an error the one loaded before stays in use: a
// half-copied certificate must not leave the server with none.
func (r *Reloadable) Reload() error {
	cfg, err := r.load()
	if err != nil {
		return err
	}
	r.cur.Store(cfg)
	return nil
}

// Config returns the configuration loaded last.
func (r *Reloadable) Config() *tls.Config { return r.cur.Load() }
