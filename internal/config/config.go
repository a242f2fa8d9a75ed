// Package config is tierblk's YAML configuration: its defaults, loading (unknown fields are errors,
// never ignored) and validation. Every error names the field and says what would be valid, so a
// user can fix the file without reading code. It must never open backends or touch the disk
// beyond reading the config file: that is the daemon's job.
package config

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/tierblk/tierblk/internal/metrics"
	"github.com/tierblk/tierblk/internal/tlsconf"
	"github.com/tierblk/tierblk/pkg/backend"
)

// Config is the whole configuration of one daemon.
type Config struct {
	// Exports are the devices served; the first is also the default export (the empty name).
	Exports []Export `yaml:"exports"`
	// Listen holds NBD listen addresses: "unix:/path/to.sock" or "HOST:PORT".
	Listen []string `yaml:"listen"`
	// Allow lists the networks (CIDR) and addresses whose clients may connect to the TCP
	// listeners; empty: any. Unix-socket clients are governed by SocketMode and SocketGroup.
	Allow []string `yaml:"allow"`
	// SocketMode is the permission bits of the NBD unix sockets, in octal ("0660"); connecting
	// needs write permission. Empty: as the umask leaves them.
	SocketMode string `yaml:"socket_mode"`
	// SocketGroup is the group of the NBD unix sockets, a name or a number. Empty: the daemon's.
	SocketGroup string `yaml:"socket_group"`
	// LogLevel is debug, info, warn or error.
	LogLevel string `yaml:"log_level"`
	// MaxInFlight bounds the requests served at once on one NBD connection.
	MaxInFlight int `yaml:"max_in_flight"`
	// Admin is the address of the admin endpoint (/metrics, /stats): 127.0.0.1:PORT, [::1]:PORT,
	// localhost:PORT or unix:/path. Empty: none.
	Admin string `yaml:"admin"`
	// Metrics is the address of a read-only endpoint that serves GET /metrics and /stats alone,
	// which may be any HOST:PORT (:9810 for every address) for a Prometheus on another host, or
	// unix:/path. Empty: none.
	Metrics string `yaml:"metrics"`
	// TLS is how the NBD listeners offer TLS.
	TLS TLS `yaml:"tls"`
	// RunDir holds what must outlive a tierblk process but not a reboot, as the kernel's block
	// devices do: the SSD tiers' run logs and the marks of devices a clean stop left. A tmpfs.
	RunDir string `yaml:"run_dir"`
	// LockMemory locks the daemon's memory in RAM (mlockall), for a device that swap or the root
	// file system lives on: a page of the daemon swapped out to the device it serves could never
	// come back.
	LockMemory bool `yaml:"lock_memory"`
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
	// Backend is a URL: file:///path, mem://SIZE, nbd://HOST:PORT/EXPORT, nbd+unix:///EXPORT?socket=PATH,
	// iscsi://HOST[:PORT]/TARGET-IQN/LUN (CHAP credentials best from the environment: see
	// pkg/backend/iscsi).
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
	// NBDDeviceTimeout is how long the kernel holds the NBD device's I/O while no tierblk serves
	// it (a restart, a crash) before failing it: a duration ("" is DefaultNBDDeviceTimeout; "0"
	// fails it at once, as before tierblk could take a device over).
	NBDDeviceTimeout string `yaml:"nbd_device_timeout"`
	// NBDDeviceOnStop is what stopping tierblk (SIGTERM) does with the NBD device: "keep" (the
	// default) leaves it attached, its I/O held, for the next tierblk serving this export to take
	// over; "release" disconnects it.
	NBDDeviceOnStop string `yaml:"nbd_device_on_stop"`
}

// DefaultNBDDeviceTimeout is the default of Export.NBDDeviceTimeout.
const DefaultNBDDeviceTimeout = 2 * time.Minute

// NBDDeadConnTimeout parses NBDDeviceTimeout: whole seconds, as the kernel counts them.
func (e *Export) NBDDeadConnTimeout() (time.Duration, error) {
	if e.NBDDeviceTimeout == "" {
		return DefaultNBDDeviceTimeout, nil
	}
	d, err := time.ParseDuration(e.NBDDeviceTimeout)
	if e.NBDDeviceTimeout == "0" {
		d, err = 0, nil
	}
	if err != nil || d < 0 || d%time.Second != 0 {
		return 0, fieldErr("nbd_device_timeout", "%q: use whole seconds such as 120s or 5m (default %v), or 0 to fail I/O at once", e.NBDDeviceTimeout, DefaultNBDDeviceTimeout)
	}
	return d, nil
}

// KeepNBDDevice reports whether a stop leaves the NBD device attached (NBDDeviceOnStop).
func (e *Export) KeepNBDDevice() bool { return e.NBDDeviceOnStop != "release" }

// UBLK configures an export's ublk device. The zero value asks for a new device with the defaults.
type UBLK struct {
	// ID is the device number N of /dev/ublkbN; -1 (the default) lets the kernel choose. With a
	// fixed ID a restarted daemon takes back a device its killed predecessor left waiting.
	ID *int `yaml:"id"`
	// Queues is the number of hardware queues, each with its own io_uring (default: one per CPU).
	Queues int `yaml:"queues"`
	// Depth is the number of requests each queue holds at once (default 128).
	Depth int `yaml:"depth"`
	// OnStop is what stopping tierblk (SIGTERM) does with the device: "keep" leaves it, its I/O
	// held, for the next tierblk serving this export to take back; "remove" deletes it. The
	// default is keep with a fixed ID (only such a device can be taken back), else remove.
	OnStop string `yaml:"on_stop"`
}

// KeepOnStop reports whether a stop leaves the device for the next tierblk (OnStop).
func (u *UBLK) KeepOnStop() bool {
	return u != nil && (u.OnStop == "keep" || u.OnStop == "" && u.DeviceID() >= 0)
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
	switch u.OnStop {
	case "", "remove":
	case "keep":
		if u.DeviceID() < 0 {
			errs = append(errs, fieldErr("on_stop", "keep needs a fixed device number (ublk.id, --ublk-id N): only a device made with one can be taken back"))
		}
	default:
		errs = append(errs, fieldErr("on_stop", "%q: use keep or remove", u.OnStop))
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
		RunDir:      DefaultRunDir(),
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

// Parse decodes YAML over Defaults(). name is used in error messages, which say where in the file
// (name:LINE) and which field (exports[0].cache.ram) is wrong, and what would be valid.
func Parse(data []byte, name string) (Config, error) {
	c := Defaults()
	c.Listen = nil // absent: the default, unless an export is served as a block device
	if err := decode(data, name, &c); err != nil {
		return Config{}, err
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
	files := map[string]int{} // file backends, by path
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
		} else if path := backendFile(e.Backend); path != "" {
			if j, dup := files[path]; dup && !(e.ReadOnly && c.Exports[j].ReadOnly) {
				errs = append(errs, fieldErr(f+".backend", "the file %s is also the backend of exports[%d] (%q); one export a file, unless every export of it is read_only: two caches of one file would each serve data the other's writes made stale", path, j, c.Exports[j].Name))
			}
			files[path] = i
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
			if _, err := e.NBDDeadConnTimeout(); err != nil {
				var fe *Error
				if errors.As(err, &fe) {
					err = fieldErr(f+"."+fe.Field, "%s", fe.Msg)
				}
				errs = append(errs, err)
			}
			if e.NBDDeviceOnStop != "" && e.NBDDeviceOnStop != "keep" && e.NBDDeviceOnStop != "release" {
				errs = append(errs, fieldErr(f+".nbd_device_on_stop", "%q: use keep or release", e.NBDDeviceOnStop))
			}
		}
	}
	// An SSD tier on a backend's file would overwrite the data it caches.
	for i, e := range c.Exports {
		if e.Cache == nil || e.Cache.SSD == "" {
			continue
		}
		switch j, dup := files[filepath.Clean(e.Cache.SSD)]; {
		case dup && j == i:
			errs = append(errs, fieldErr(fmt.Sprintf("exports[%d].cache.ssd", i), "%s is also the export's backend; an SSD tier needs a file or device of its own", e.Cache.SSD))
		case dup:
			errs = append(errs, fieldErr(fmt.Sprintf("exports[%d].cache.ssd", i), "%s is the backend of exports[%d] (%q); an SSD tier needs a file or device of its own", e.Cache.SSD, j, c.Exports[j].Name))
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
	if c.Metrics != "" {
		if _, _, err := metrics.ParseMetricsAddr(c.Metrics); err != nil {
			errs = append(errs, fieldErr("metrics", "%v", err))
		}
	}
	if len(c.Listen) == 0 && !devices {
		errs = append(errs, fieldErr("listen", "no listen address and no block device; give --nbd unix:/path/to.sock, --nbd HOST:PORT, --ublk or --nbd-device /dev/nbdN"))
	}
	seen := map[string]bool{}
	networks := map[string]bool{}
	for i, a := range c.Listen {
		f := fmt.Sprintf("listen[%d]", i)
		network, _, err := ParseListenAddr(a)
		if err != nil {
			errs = append(errs, fieldErr(f, "%v", err))
		}
		networks[network] = true
		if seen[a] {
			errs = append(errs, fieldErr(f, "%q is listed twice", a))
		}
		seen[a] = true
	}
	errs = append(errs, c.validateAccess(networks)...)
	if _, err := ParseLogLevel(c.LogLevel); err != nil {
		errs = append(errs, fieldErr("log_level", "%v", err))
	}
	if c.RunDir == "" {
		errs = append(errs, fieldErr("run_dir", "is empty; give a directory on a tmpfs (default /run/tierblk)"))
	}
	if c.MaxInFlight < 1 || c.MaxInFlight > 4096 {
		errs = append(errs, fieldErr("max_in_flight", "%d is out of range; use 1 to 4096 (default 64)", c.MaxInFlight))
	}
	errs = append(errs, c.TLS.validate()...)
	return errors.Join(errs...)
}

// validateAccess checks the settings of who may connect, given the networks of the listen
// addresses ("tcp", "unix"): each would have no effect without a listener of its kind.
func (c *Config) validateAccess(networks map[string]bool) []error {
	var errs []error
	if _, err := c.AllowPrefixes(); err != nil {
		errs = append(errs, err)
	}
	if len(c.Allow) > 0 && !networks["tcp"] {
		errs = append(errs, fieldErr("allow", "is set but no listen address is HOST:PORT; it governs TCP clients only"))
	}
	if c.SocketMode != "" {
		if _, err := ParseSocketMode(c.SocketMode); err != nil {
			errs = append(errs, fieldErr("socket_mode", "%v", err))
		}
	}
	for _, s := range [...]struct{ field, value string }{{"socket_mode", c.SocketMode}, {"socket_group", c.SocketGroup}} {
		if s.value != "" && !networks["unix"] {
			errs = append(errs, fieldErr(s.field, "is set but no listen address is unix:/path; it governs the NBD unix sockets only"))
		}
	}
	return errs
}

// ParseAllow parses an entry of allow: a network in CIDR notation (10.0.0.0/8, fd00::/64) or one
// IP address (192.168.1.7, which stands for 192.168.1.7/32).
func ParseAllow(s string) (netip.Prefix, error) {
	const use = "write a network as 10.0.0.0/8 or fd00::/64, or one address as 192.168.1.7 or fd00::7"
	var p netip.Prefix
	if strings.Contains(s, "/") {
		var err error
		if p, err = netip.ParsePrefix(s); err != nil {
			return p, fmt.Errorf("%q is not a network in CIDR notation; %s", s, use)
		}
		if p != p.Masked() {
			return p, fmt.Errorf("%q has bits set past its /%d: write %s for the network, or %s for the one address", s, p.Bits(), p.Masked(), p.Addr())
		}
	} else {
		a, err := netip.ParseAddr(s)
		if err != nil || a.Zone() != "" {
			return p, fmt.Errorf("%q is not an IP address or a network; %s", s, use)
		}
		p = netip.PrefixFrom(a, a.BitLen())
	}
	if p.Addr().Is4In6() {
		// Clients' IPv4-mapped addresses are compared as IPv4, so that such an entry would match no one.
		return p, fmt.Errorf("%q is an IPv4-mapped IPv6 address; write the IPv4 form (10.0.0.0/8), which also covers IPv4 clients of a dual-stack listener", s)
	}
	return p, nil
}

// AllowPrefixes returns allow's networks; the error names every entry that is not one.
func (c *Config) AllowPrefixes() ([]netip.Prefix, error) {
	ps := make([]netip.Prefix, 0, len(c.Allow))
	var errs []error
	for i, a := range c.Allow {
		p, err := ParseAllow(a)
		if err != nil {
			errs = append(errs, fieldErr(fmt.Sprintf("allow[%d]", i), "%v", err))
			continue
		}
		ps = append(ps, p)
	}
	return ps, errors.Join(errs...)
}

// ParseSocketMode parses socket_mode: permission bits in octal, from 0 to 0777.
func ParseSocketMode(s string) (fs.FileMode, error) {
	m, err := strconv.ParseUint(s, 8, 32)
	if err != nil || m > 0o777 {
		return 0, fmt.Errorf("%q is not permission bits in octal (0 to 0777); e.g. 0660 lets the owner and the group connect, 0600 the owner only", s)
	}
	return fs.FileMode(m), nil
}

func checkBackendURL(raw string, schemes []string) error {
	if raw == "" {
		return errors.New("missing; give a URL such as file:///srv/disk.img or mem://1GiB")
	}
	// Checked without its password, which may hold what url.Parse refuses (libiscsi's
	// iscsi://USER%PASSWORD@HOST/...: the backend's own parser reads it) and must not be shown.
	shown := backend.Redact(raw)
	u, err := url.Parse(shown)
	if err != nil {
		return fmt.Errorf("%q is not a URL: %v", shown, err)
	}
	for _, s := range schemes {
		if u.Scheme == s {
			return nil
		}
	}
	return fmt.Errorf("%q has unknown scheme %q; use one of %s", shown, u.Scheme, strings.Join(schemes, ", "))
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

// backendFile is the cleaned path of a file:// backend URL, "" for any other.
func backendFile(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "file" || u.Path == "" {
		return ""
	}
	return filepath.Clean(u.Path)
}
