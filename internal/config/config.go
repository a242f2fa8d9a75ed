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
	"regexp"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/tierblk/tierblk/internal/metrics"
	"github.com/tierblk/tierblk/internal/tlsconf"
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
	// Admin is the address of the admin endpoint (/metrics, /stats): 127.0.0.1:PORT, [::1]:PORT,
	// localhost:PORT or unix:/path. Empty: none.
	Admin string `yaml:"admin"`
	// TLS is how the NBD listeners offer TLS.
	TLS TLS `yaml:"tls"`
}

// TLS configures TLS (X.509 certificates) on every NBD listener.
type TLS struct {
	// Mode is off, on (each client chooses) or require (nothing but TLS).
	Mode string `yaml:"mode"`
	// Certificates is a directory in nbdkit's layout: ca-cert.pem, server-cert.pem,
	// server-key.pem, and optionally ca-crl.pem. The daemon loads it, and again on SIGHUP.
	Certificates string `yaml:"certificates"`
	// VerifyPeer requires every TLS client to present a certificate that the CA signed and
	// the CRL does not revoke.
	VerifyPeer bool `yaml:"verify_peer"`
}

func (t *TLS) validate() []error {
	mode, err := tlsconf.ParseMode(t.Mode)
	if err != nil {
		return []error{fieldErr("tls.mode", "%v", err)}
	}
	var errs []error
	if mode != tlsconf.Off && t.Certificates == "" {
		errs = append(errs, fieldErr("tls.certificates", "missing; with tls.mode %s, give the directory of ca-cert.pem, server-cert.pem and server-key.pem", t.Mode))
	}
	if mode == tlsconf.Off && t.VerifyPeer {
		errs = append(errs, fieldErr("tls.verify_peer", "checks the certificates of TLS clients, and tls.mode is off: set tls.mode to on or require"))
	}
	return errs
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
	// Cache puts a tiered cache in front of the backend; without it the backend is served directly.
	Cache *Cache `yaml:"cache"`
	// UBLK, if set, also serves the export as a ublk block device (/dev/ublkbN, Linux 6.0+).
	UBLK *UBLK `yaml:"ublk"`
	// NBDDevice, if set, attaches the kernel's NBD client (/dev/nbdN) to the export through netlink.
	NBDDevice string `yaml:"nbd_device"`
}

// UBLK configures an export's ublk device. The zero value asks for a new device with the defaults.
type UBLK struct {
	// ID is the device number N of /dev/ublkbN; -1 (the default) lets the kernel choose. With a
	// fixed ID a restarted daemon takes back a device its killed predecessor left waiting.
	ID *int `yaml:"id"`
	// Queues is the number of hardware queues, each with its own io_uring (default: one per CPU).
	Queues int `yaml:"queues"`
	// Depth is the number of requests each queue holds at once (default 128).
	Depth int `yaml:"depth"`
}

// DeviceID is the configured device number, or -1 for any.
func (u *UBLK) DeviceID() int {
	if u == nil || u.ID == nil {
		return -1
	}
	return *u.ID
}

// UBLKMaxQueues and UBLKMaxDepth are the kernel's limits (UBLK_MAX_NR_QUEUES, UBLK_MAX_QUEUE_DEPTH).
const (
	UBLKMaxQueues = 4096
	UBLKMaxDepth  = 4096
)

func (u *UBLK) validate() []error {
	var errs []error
	if id := u.DeviceID(); id < -1 || id > 1<<20 {
		errs = append(errs, fieldErr("id", "%d is out of range; use -1 (any) or a device number from 0", id))
	}
	if u.Queues < 0 || u.Queues > UBLKMaxQueues {
		errs = append(errs, fieldErr("queues", "%d is out of range; use 1 to %d, or 0 for one per CPU", u.Queues, UBLKMaxQueues))
	}
	if u.Depth < 0 || u.Depth > UBLKMaxDepth {
		errs = append(errs, fieldErr("depth", "%d is out of range; use 1 to %d, or 0 for 128", u.Depth, UBLKMaxDepth))
	}
	return errs
}

// nbdDeviceRe is what a kernel NBD device path looks like.
var nbdDeviceRe = regexp.MustCompile(`^/dev/nbd[0-9]+$`)

// Defaults returns the configuration used when neither a file nor flags say otherwise.
func Defaults() Config {
	return Config{
		Listen:      []string{"127.0.0.1:10809"},
		LogLevel:    "info",
		MaxInFlight: 64,
		TLS:         TLS{Mode: tlsconf.Off.String()},
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
	c.Listen = nil // absent: the default, unless an export is served as a block device
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil && !errors.Is(err, io.EOF) {
		return Config{}, fmt.Errorf("config %s: %s", name, strings.TrimPrefix(err.Error(), "yaml: "))
	}
	if c.Listen == nil && !c.servesDevices() {
		c.Listen = Defaults().Listen
	}
	return c, nil
}

// servesDevices reports whether an export is served as a block device of this machine (ublk or
// the kernel's NBD client): then the device is what was asked for, and an NBD listener nobody
// named would only be exposure.
func (c *Config) servesDevices() bool {
	for _, e := range c.Exports {
		if e.UBLK != nil || e.NBDDevice != "" {
			return true
		}
	}
	return false
}

// Validate checks every field. schemes lists the backend URL schemes this binary knows.
func (c *Config) Validate(schemes []string) error {
	var errs []error
	if len(c.Exports) == 0 {
		errs = append(errs, fieldErr("exports", "no export configured; give --backend URL or an exports list in the config file"))
	}
	names := map[string]int{}
	ssds := map[string]int{}
	nbdDevs := map[string]int{}
	devices := false
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
		if e.Cache != nil {
			for _, err := range e.Cache.validate() {
				var fe *Error
				if errors.As(err, &fe) {
					err = fieldErr(f+".cache."+fe.Field, "%s", fe.Msg)
				}
				errs = append(errs, err)
			}
			if e.Cache.SSD != "" && strings.HasPrefix(e.Backend, "mem:") {
				errs = append(errs, fieldErr(f+".cache.ssd", "the backend %q loses its data on exit, so an SSD tier kept across restarts would serve data it no longer has; use a RAM-only cache", e.Backend))
			}
			if e.Cache.SSD != "" {
				if j, dup := ssds[e.Cache.SSD]; dup {
					errs = append(errs, fieldErr(f+".cache.ssd", "%q is also the SSD of exports[%d]; each export needs its own", e.Cache.SSD, j))
				}
				ssds[e.Cache.SSD] = i
			}
		}
		if e.UBLK != nil {
			devices = true
			for _, err := range e.UBLK.validate() {
				var fe *Error
				if errors.As(err, &fe) {
					err = fieldErr(f+".ublk."+fe.Field, "%s", fe.Msg)
				}
				errs = append(errs, err)
			}
		}
		if e.NBDDevice != "" {
			devices = true
			if !nbdDeviceRe.MatchString(e.NBDDevice) {
				errs = append(errs, fieldErr(f+".nbd_device", "%q is not a kernel NBD device; use /dev/nbdN, e.g. /dev/nbd0", e.NBDDevice))
			} else if j, dup := nbdDevs[e.NBDDevice]; dup {
				errs = append(errs, fieldErr(f+".nbd_device", "%q is also the device of exports[%d]; each export needs its own", e.NBDDevice, j))
			}
			nbdDevs[e.NBDDevice] = i
		}
	}
	// IDs must differ too; -1 (any) may repeat.
	ublkIDs := map[int]int{}
	for i, e := range c.Exports {
		if id := e.UBLK.DeviceID(); e.UBLK != nil && id >= 0 {
			if j, dup := ublkIDs[id]; dup {
				errs = append(errs, fieldErr(fmt.Sprintf("exports[%d].ublk.id", i), "%d is also the ublk device of exports[%d]", id, j))
			}
			ublkIDs[id] = i
		}
	}
	if c.Admin != "" {
		if _, _, err := metrics.ParseAdminAddr(c.Admin); err != nil {
			errs = append(errs, fieldErr("admin", "%v", err))
		}
	}
	if len(c.Listen) == 0 && !devices {
		errs = append(errs, fieldErr("listen", "no listen address and no block device; give --nbd unix:/path/to.sock, --nbd HOST:PORT, --ublk or --nbd-device /dev/nbdN"))
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
	errs = append(errs, c.TLS.validate()...)
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
