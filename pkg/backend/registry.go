package backend

import (
	"fmt"
	"log/slog"
	"net/url"
	"sort"
	"strings"
)

// Options are the settings that every backend understands. Backend-specific settings travel in the
// URL's query (for example file:///srv/disk.img?direct=true).
type Options struct {
	// ReadOnly opens the backend for reading only; writes fail with ErrReadOnly.
	ReadOnly bool
	// Logger is where a backend that logs (the NBD client: reconnections) logs; nil for
	// slog.Default().
	Logger *slog.Logger
}

// Factory opens a backend from its parsed URL.
type Factory func(u *url.URL, opts Options) (Backend, error)

// Registry maps URL schemes to factories. It is filled explicitly (see package registry) rather
// than by init side effects, so the set of backends a binary has is visible in one place.
type Registry struct {
	factories map[string]Factory
	usage     map[string]string
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{factories: map[string]Factory{}, usage: map[string]string{}}
}

// Register adds a scheme. usage is an example URL shown in errors. Registering a scheme twice is a
// programming error and panics.
func (r *Registry) Register(scheme, usage string, f Factory) {
	if _, dup := r.factories[scheme]; dup {
		panic("backend: scheme registered twice: " + scheme)
	}
	r.factories[scheme] = f
	r.usage[scheme] = usage
}

// Schemes lists the registered scheme names, sorted.
func (r *Registry) Schemes() []string {
	var s []string
	for k := range r.factories {
		s = append(s, k)
	}
	sort.Strings(s)
	return s
}

// Usage lists an example URL for each scheme, sorted.
func (r *Registry) Usage() []string {
	var s []string
	for _, u := range r.usage {
		s = append(s, u)
	}
	sort.Strings(s)
	return s
}

// Open parses rawURL and opens the backend its scheme names.
func (r *Registry) Open(rawURL string, opts Options) (Backend, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("backend URL %q: %w", rawURL, err)
	}
	f, ok := r.factories[u.Scheme]
	if !ok {
		return nil, fmt.Errorf("backend URL %q: unknown scheme %q; use one of: %s",
			rawURL, u.Scheme, strings.Join(r.Usage(), ", "))
	}
	b, err := f(u, opts)
	if err != nil {
		return nil, fmt.Errorf("backend %s: %w", rawURL, err)
	}
	return b, nil
}
