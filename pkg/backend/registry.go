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

// Parser parses the raw URL of a scheme whose established syntax is not RFC 3986's: libiscsi's
// iscsi://USER%PASSWORD@HOST/..., where a '%' in the user information separates rather than
// escapes, so that url.Parse refuses or misreads it.
type Parser func(rawURL string) (*url.URL, error)

// Registry maps URL schemes to factories. It is filled explicitly (see package registry) rather
// than by init side effects, so the set of backends a binary has is visible in one place.
type Registry struct {
	factories map[string]Factory
	usage     map[string]string
	parsers   map[string]Parser
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{factories: map[string]Factory{}, usage: map[string]string{}, parsers: map[string]Parser{}}
}

// RegisterParser makes Open parse the URLs of scheme, registered before, with p instead of
// url.Parse.
func (r *Registry) RegisterParser(scheme string, p Parser) {
	if _, ok := r.factories[scheme]; !ok {
		panic("backend: parser for an unregistered scheme: " + scheme)
	}
	r.parsers[scheme] = p
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

// Open parses rawURL and opens the backend its scheme names. Its errors show rawURL redacted.
func (r *Registry) Open(rawURL string, opts Options) (Backend, error) {
	parse := url.Parse
	if scheme, _, ok := strings.Cut(rawURL, ":"); ok && r.parsers[scheme] != nil {
		parse = r.parsers[scheme]
	}
	u, err := parse(rawURL)
	if err != nil {
		return nil, BadURL(fmt.Errorf("backend URL %q: %w", Redact(rawURL), err))
	}
	f, ok := r.factories[u.Scheme]
	if !ok {
		return nil, fmt.Errorf("backend URL %q: unknown scheme %q; use one of: %s",
			Redact(rawURL), u.Scheme, strings.Join(r.Usage(), ", "))
	}
	b, err := f(u, opts)
	if err != nil {
		return nil, fmt.Errorf("backend %s: %w", Redact(rawURL), err)
	}
	return b, nil
}

// Redact returns rawURL with the password in its user information, if any, replaced by "xxxxx",
// for logs, messages and anything stored. It works on the raw text, since a URL that url.Parse
// refuses must be redacted too: whatever follows the first ':' or '%' of the user information (the
// separators of RFC 3986 and of libiscsi) is hidden.
func Redact(rawURL string) string {
	scheme, rest, ok := strings.Cut(rawURL, "://")
	if !ok {
		return rawURL
	}
	authority := rest
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		authority = rest[:i]
	}
	at := strings.LastIndex(authority, "@")
	if at < 0 {
		return rawURL
	}
	user := authority[:at]
	if i := strings.IndexAny(user, ":%"); i >= 0 {
		user = user[:i] + ":xxxxx"
	}
	return scheme + "://" + user + rest[at:]
}
