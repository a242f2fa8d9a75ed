// Package config is tierblk's YAML configuration: its defaults, loading (unknown fields are errors,
// never ignored) and validation. Every error names the field and says what would be valid, so a
// user can fix the file without reading code. It must never open backends or touch the disk
// beyond reading the config file: that is the daemon's job.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strings"

	"gopkg.in/yaml.v3"
)

// Config is the whole configuration of one daemon.
type Config struct {
	// Exports are the devices served; the first is also the default export (the empty name).
	Exports []Export `yaml:"exports"`
	// Listen holds NBD listen addresses: "unix:/path/to.sock" or "HOST:PORT".
	Listen []string `yaml:"listen"`
	// LogLevel is debug, info, warn or error.
	LogLevel string `yaml:"log_level"`
	// MaxInFlight bounds the requests served at once on one NBD connection.
	MaxInFlight int `yaml:"max_in_flight"`
}

// Export is one named device.
type Export struct {
	Name        string `yaml:"name"`
	Description string `yaml:"description"`
	// Backend is a URL: file:///path, mem://SIZE, nbd://HOST:PORT/EXPORT, nbd+unix:///EXPORT?socket=PATH.
	Backend  string `yaml:"backend"`
	ReadOnly bool   `yaml:"read_only"`
	// RecordTrace, if set, is a new file that receives every request to this export as a fio
	// iolog (version 3), for `tierblk sim --format fio` and `fio --read_iolog`.
	RecordTrace string `yaml:"record_trace"`
}

// Defaults returns the configuration used when neither a file nor flags say otherwise.
func Defaults() Config {
	return Config{
		Listen:      []string{"127.0.0.1:10809"},
		LogLevel:    "info",
		MaxInFlight: 64,
	}
}

// Error is a configuration error; Field names the offending setting (as written in YAML, with the
// index for lists, e.g. "exports[1].backend").
type Error struct {
	Field string
	Msg   string
}

func (e *Error) Error() string { return e.Field + ": " + e.Msg }

func fieldErr(field, format string, args ...any) error {
	return &Error{Field: field, Msg: fmt.Sprintf(format, args...)}
}

// Load reads the YAML file at path over Defaults(). It does not validate: callers apply flag
// overrides first, then call Validate.
func Load(path string) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("config: %w", err)
	}
	return Parse(data, path)
}

// Parse decodes YAML over Defaults(). name is used in error messages.
func Parse(data []byte, name string) (Config, error) {
	c := Defaults()
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil && !errors.Is(err, io.EOF) {
		return Config{}, fmt.Errorf("config %s: %s", name, strings.TrimPrefix(err.Error(), "yaml: "))
	}
	return c, nil
}

// Validate checks every field. schemes lists the backend URL schemes this binary knows.
func (c *Config) Validate(schemes []string) error {
	var errs []error
	if len(c.Exports) == 0 {
		errs = append(errs, fieldErr("exports", "no export configured; give --backend URL or an exports list in the config file"))
	}
	names := map[string]int{}
	for i, e := range c.Exports {
		f := fmt.Sprintf("exports[%d]", i)
		if j, dup := names[e.Name]; dup {
			errs = append(errs, fieldErr(f+".name", "%q is also the name of exports[%d]; names must be unique", e.Name, j))
		}
		names[e.Name] = i
		if len(e.Name) > 4096 || len(e.Description) > 4096 {
			errs = append(errs, fieldErr(f, "name and description must be at most 4096 bytes (the NBD limit)"))
		}
		if err := checkBackendURL(e.Backend, schemes); err != nil {
			errs = append(errs, fieldErr(f+".backend", "%v", err))
		}
	}
	if len(c.Listen) == 0 {
		errs = append(errs, fieldErr("listen", "no listen address; give --nbd unix:/path/to.sock or --nbd HOST:PORT"))
	}
	seen := map[string]bool{}
	for i, a := range c.Listen {
		f := fmt.Sprintf("listen[%d]", i)
		if _, _, err := ParseListenAddr(a); err != nil {
			errs = append(errs, fieldErr(f, "%v", err))
		}
		if seen[a] {
			errs = append(errs, fieldErr(f, "%q is listed twice", a))
		}
		seen[a] = true
	}
	if _, err := ParseLogLevel(c.LogLevel); err != nil {
		errs = append(errs, fieldErr("log_level", "%v", err))
	}
	if c.MaxInFlight < 1 || c.MaxInFlight > 4096 {
		errs = append(errs, fieldErr("max_in_flight", "%d is out of range; use 1 to 4096 (default 64)", c.MaxInFlight))
	}
	return errors.Join(errs...)
}

func checkBackendURL(raw string, schemes []string) error {
	if raw == "" {
		return errors.New("missing; give a URL such as file:///srv/disk.img or mem://1GiB")
	}
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("%q is not a URL: %v", raw, err)
	}
	for _, s := range schemes {
		if u.Scheme == s {
			return nil
		}
	}
	return fmt.Errorf("%q has unknown scheme %q; use one of %s", raw, u.Scheme, strings.Join(schemes, ", "))
}

// ParseListenAddr splits "unix:/path" into ("unix", "/path") and "HOST:PORT" into ("tcp", "HOST:PORT").
func ParseListenAddr(a string) (network, address string, err error) {
	if p, ok := strings.CutPrefix(a, "unix:"); ok {
		if p == "" {
			return "", "", fmt.Errorf("%q has no socket path; write unix:/path/to.sock", a)
		}
		return "unix", p, nil
	}
	// An empty host listens on every address, as net.Listen does.
	_, port, err := net.SplitHostPort(a)
	if err != nil {
		return "", "", fmt.Errorf("%q is neither unix:/path/to.sock nor HOST:PORT", a)
	}
	if port == "" {
		return "", "", fmt.Errorf("%q has no port; NBD's usual port is 10809", a)
	}
	return "tcp", a, nil
}

// ParseLogLevel maps a level name to slog's level.
func ParseLogLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return 0, fmt.Errorf("%q is not a level; use debug, info, warn or error", s)
	}
	return l, nil
}
