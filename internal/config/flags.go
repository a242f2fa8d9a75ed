package config

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/tierblk/tierblk/internal/cache"
	"github.com/tierblk/tierblk/internal/units"
)

// Flag is one setting that `tierblk serve` takes on its command line, declared once: serve makes
// its flag from Name, Kind, Def and Usage; Override stores what was typed into the Config, over
// the file; FlagNames names the flag, not Field, in the errors about what it set. Validation stays
// with the Config (Validate), the one place that judges a value whichever way it came.
type Flag struct {
	Name string // without the dashes
	// Field is the path of the setting as errors name it (Error.Field), "[]" standing for any
	// index; empty for a flag no error names.
	Field string
	Kind  Kind
	Def   string // the default the help shows; empty for none
	Usage string
	// apply stores the flag's values (one each time it was given) into c; given reports which
	// other flags were given.
	apply func(c *Config, vals []string, given func(string) bool) error
}

// Kind is what a flag's text must parse as; the command line refuses anything else at once.
type Kind int

// The kinds of flags.
const (
	String Kind = iota
	Bool
	Int
	Ratio64 // a number, stored as a *float64 so that an explicit 0 is kept
	List    // a string that may be given several times
)

// Type is the kind's name in serve's help.
func (k Kind) Type() string {
	return [...]string{"string", "bool", "int", "float", "stringArray"}[k]
}

// Check reports whether s parses as the kind.
func (k Kind) Check(s string) error {
	var err error
	switch k {
	case Bool:
		_, err = strconv.ParseBool(s)
	case Int:
		_, err = strconv.Atoi(s)
	case Ratio64:
		_, err = strconv.ParseFloat(s, 64)
	}
	if err != nil {
		return fmt.Errorf("%q is not a%s", s, map[Kind]string{Bool: " boolean", Int: "n integer", Ratio64: " number"}[k])
	}
	return nil
}

// Flags are serve's settings, in the order Override applies them: --backend first, since it
// replaces the exports that the other flags then set.
var Flags = []Flag{
	{Name: "backend", Field: "exports[0].backend", Usage: "backend URL to serve as a single export (replaces the config's exports)",
		apply: func(c *Config, v []string, _ func(string) bool) error {
			c.Exports = []Export{{Backend: last(v)}}
			return nil
		}},
	{Name: "export", Field: "exports[0].name", Usage: "name of the export given by --backend (clients that ask for no name get it too)",
		apply: func(c *Config, v []string, given func(string) bool) error {
			if !given("backend") {
				return errors.New("--export names the export of --backend; give --backend too")
			}
			c.Exports[0].Name = last(v)
			return nil
		}},
	{Name: "nbd", Field: "listen[]", Kind: List, Def: strings.Join(Defaults().Listen, ","),
		Usage: "NBD listen address, unix:/path/to.sock or HOST:PORT; repeat for several",
		apply: func(c *Config, v []string, _ func(string) bool) error { c.Listen = v; return nil }},
	{Name: "allow", Field: "allow[]", Kind: List,
		Usage: "TCP clients may connect only from this network (CIDR, e.g. 192.168.1.0/24) or address; repeat for several (default: from anywhere)",
		apply: func(c *Config, v []string, _ func(string) bool) error { c.Allow = v; return nil }},
	{Name: "socket-mode", Field: "socket_mode", Usage: "permission bits of the NBD unix sockets in octal, e.g. 0660 (connecting needs write permission; default: as the umask leaves them)",
		apply: func(c *Config, v []string, _ func(string) bool) error { c.SocketMode = last(v); return nil }},
	{Name: "socket-group", Field: "socket_group", Usage: "group of the NBD unix sockets, a name or a GID (default: the daemon's)",
		apply: func(c *Config, v []string, _ func(string) bool) error { c.SocketGroup = last(v); return nil }},
	{Name: "read-only", Kind: Bool, Usage: "serve every export read-only",
		apply: func(c *Config, v []string, _ func(string) bool) error {
			ro, _ := strconv.ParseBool(last(v))
			for i := range c.Exports {
				c.Exports[i].ReadOnly = ro
			}
			return nil
		}},
	{Name: "log-level", Field: "log_level", Def: Defaults().LogLevel, Usage: "debug, info, warn or error",
		apply: func(c *Config, v []string, _ func(string) bool) error { c.LogLevel = last(v); return nil }},
	{Name: "max-in-flight", Field: "max_in_flight", Kind: Int, Def: strconv.Itoa(Defaults().MaxInFlight),
		Usage: "requests served at once on one NBD connection",
		apply: func(c *Config, v []string, _ func(string) bool) error {
			c.MaxInFlight, _ = strconv.Atoi(last(v))
			return nil
		}},
	{Name: "run-dir", Field: "run_dir", Def: Defaults().RunDir,
		Usage: "directory on a tmpfs for the SSD tiers' run logs and the marks of kernel devices left attached (default for a user other than root: /run/tierblk if it is theirs, else $XDG_RUNTIME_DIR/tierblk, else /dev/shm/tierblk-UID)",
		apply: func(c *Config, v []string, _ func(string) bool) error { c.RunDir = last(v); return nil }},
	{Name: "lock-memory", Field: "lock_memory", Kind: Bool,
		Usage: "lock the daemon's memory in RAM (mlockall): for a device holding swap or the root file system; needs root or CAP_IPC_LOCK",
		apply: func(c *Config, v []string, _ func(string) bool) error {
			c.LockMemory, _ = strconv.ParseBool(last(v))
			return nil
		}},
	{Name: "admin", Field: "admin", Usage: "admin endpoint (/metrics, /stats): 127.0.0.1:PORT or unix:/path; loopback only",
		apply: func(c *Config, v []string, _ func(string) bool) error { c.Admin = last(v); return nil }},
	{Name: "metrics", Field: "metrics", Usage: "read-only endpoint serving /metrics and /stats alone, on any address (:9810) for a Prometheus on another host",
		apply: func(c *Config, v []string, _ func(string) bool) error { c.Metrics = last(v); return nil }},
	{Name: "tls", Field: "tls.mode", Def: Defaults().TLS.Mode,
		Usage: "TLS on the NBD listeners: off, on (each client chooses) or require (needs --tls-certificates)",
		apply: func(c *Config, v []string, _ func(string) bool) error { c.TLS.Mode = last(v); return nil }},
	{Name: "tls-certificates", Field: "tls.certificates",
		Usage: "directory of ca-cert.pem, server-cert.pem, server-key.pem and optionally ca-crl.pem (nbdkit's layout); reloaded on SIGHUP",
		apply: func(c *Config, v []string, _ func(string) bool) error { c.TLS.Certificates = last(v); return nil }},
	{Name: "tls-verify-peer", Field: "tls.verify_peer", Kind: Bool,
		Usage: "require TLS clients to present a certificate signed by ca-cert.pem (and not revoked by ca-crl.pem)",
		apply: func(c *Config, v []string, _ func(string) bool) error {
			c.TLS.VerifyPeer, _ = strconv.ParseBool(last(v))
			return nil
		}},
	firstExport("record-trace", "record_trace", "record every request to the (first) export into this new file, a fio iolog that 'tierblk sim' replays",
		func(e *Export, v string) error { e.RecordTrace = v; return nil }),
	cacheFlag("ram", "ram", "RAM tier size, e.g. 1GiB (0: none)", func(c *Cache, v string) { c.RAM = v }),
	cacheFlag("ssd", "ssd", "SSD tier: a file (created sparse at --ssd-size if missing) or a block device", func(c *Cache, v string) { c.SSD = v }),
	cacheFlag("ssd-size", "ssd_size", "how much of --ssd the cache uses (default: all of it)", func(c *Cache, v string) { c.SSDSize = v }),
	cacheFlag("meta", "meta", "directory of the SSD tier's metadata (default: the --ssd path + .meta)", func(c *Cache, v string) { c.Meta = v }),
	cacheFlag("line", "line", "cache line size, a power of two from 4KiB to 1MiB (default 64KiB)", func(c *Cache, v string) { c.Line = v }),
	cacheFlag("mode", "mode", "cache mode: writethrough (default), writearound, passthrough or writeback (needs --ssd)", func(c *Cache, v string) { c.Mode = v }),
	cacheFlag("policy", "policy", "eviction policy of the cache tiers (default "+cache.DefaultPolicy+"; see 'tierblk sim --help')", func(c *Cache, v string) { c.Policy = v }),
	cacheFlag("admission", "admission", "admission policy of both cache tiers (default auto; e.g. always, nhit:2, seqcutoff)", func(c *Cache, v string) { c.Admission = v }),
	cacheFlag("congestion", "congestion", "the SSD tier admits no missed line while its device's requests take longer than this and than the backend's reads (default "+cache.DefaultCongestion.String()+"; off: never)",
		func(c *Cache, v string) { c.Congestion = v }),
	cacheFlag("curves", "curves", "live miss-ratio curves of the cache's last tier for every policy and size, in 'tierblk stats --mrc' and /metrics: on (default) or off",
		func(c *Cache, v string) { c.Curves = v }),
	cacheFlag("reduction", "reduction", "what the SSD tier stores no more of: off; zero (zero blocks take no SSD write or read); compress (the default: zero blocks, and every other block compressed: the tier holds more, for more index RAM per line); or dedupe (as compress, and a block with the bytes of one the tier holds is stored as a reference to it; about 72 bytes of RAM per unit remembered)",
		func(c *Cache, v string) { c.Reduction = v }),
	scrubFlag("scrub-every", "every", fmt.Sprintf("%gh", DefaultScrubEvery.Hours()),
		"scrub the SSD tier (read and check every block it stores) this long after the start and then as often (0: never)",
		func(s *Scrub, v string) { s.Every = v }),
	scrubFlag("scrub-rate", "rate", units.FormatSize(DefaultScrubRate)+"/s",
		"the most a scheduled scrub reads a second, e.g. 100MiB/s (0: as fast as the SSD goes)",
		func(s *Scrub, v string) { s.Rate = v }),
	dirtyFlag("dirty-high", "high", cache.DefaultWriteBack.High, "write-back: destage starts when this ratio of the SSD tier's lines is dirty", func(w *WriteBack) **float64 { return &w.High }),
	dirtyFlag("dirty-low", "low", cache.DefaultWriteBack.Low, "write-back: destage stops below this ratio of dirty lines", func(w *WriteBack) **float64 { return &w.Low }),
	dirtyFlag("dirty-max", "max", cache.DefaultWriteBack.Max, "write-back: writes wait rather than let dirty lines pass this ratio", func(w *WriteBack) **float64 { return &w.Max }),
	cacheFlag("dirty-on-stop", "write_back.on_stop", "what a stop (SIGTERM) does with write-back's dirty data: keep (on the SSD tier for the next start; the default) or flush (written back to the backend before exiting)",
		func(c *Cache, v string) { c.WriteBack.OnStop = v }),
	cacheFlag("write-back-order", "write_back.order", "the order write-back's dirty data goes back to the backend in: flush (the default: the writes between two FLUSHes after all earlier ones, so that the backend alone is always consistent, only older) or address (coalesced across FLUSHes, faster; while dirty data remains the backend alone may be torn)",
		func(c *Cache, v string) { c.WriteBack.Order = v }),
	{Name: "replica", Field: "exports[0].cache.write_back.replicas[]", Kind: List,
		Usage: "write-back: also log every change on this replica (an NBD URL of 'tierblk replica serve' on a peer, e.g. nbd://peer:10810/nas); a FLUSH then waits for it too; repeat for two",
		apply: func(c *Config, v []string, _ func(string) bool) error {
			if e := first(c); e != nil {
				if e.Cache == nil {
					e.Cache = &Cache{}
				}
				e.Cache.WriteBack.Replicas = v
			}
			return nil
		}},
	cacheFlag("on-replica-loss", "write_back.on_replica_loss", "what a lost replica makes the cache do: writethrough (the default: write the dirty data back and write through until it is back) or wait (FLUSH waits until it is back)",
		func(c *Cache, v string) { c.WriteBack.OnReplicaLoss = v }),
	{Name: "take-over", Field: "exports[0].cache.write_back.take_over", Kind: Bool,
		Usage: "write-back, with an empty cache: apply the changes a replica's log holds (a primary that is gone: its host dead, the VM moved) to the backend before serving; without it such a start is refused",
		apply: func(c *Config, v []string, _ func(string) bool) error {
			on, _ := strconv.ParseBool(last(v))
			if e := first(c); e != nil {
				if e.Cache == nil {
					e.Cache = &Cache{}
				}
				e.Cache.WriteBack.TakeOver = on
			}
			return nil
		}},
	{Name: "ublk", Kind: Bool, Usage: "also serve the export as a ublk block device /dev/ublkbN",
		apply: func(c *Config, v []string, _ func(string) bool) error {
			on, _ := strconv.ParseBool(last(v))
			if e := first(c); e != nil {
				e.UBLK = nil
				if on {
					e.UBLK = &UBLK{}
				}
			}
			return nil
		}},
	ublkFlag("ublk-id", "id", "-1", "ublk device number N (-1: the kernel chooses); a restart with the same N takes back the device a stop (or a killed daemon) left",
		func(u *UBLK, n int) { u.ID = &n }),
	ublkFlag("ublk-queues", "queues", "0", "ublk hardware queues, each with its own io_uring (0: one per CPU)", func(u *UBLK, n int) { u.Queues = n }),
	ublkFlag("ublk-depth", "depth", "0", "requests in flight per ublk queue (0: 128)", func(u *UBLK, n int) { u.Depth = n }),
	ublkOption("ublk-on-stop", "on_stop", "what a stop does with the ublk device: keep (its I/O held for the next tierblk to take back; the default with --ublk-id) or remove",
		func(u *UBLK, v string) { u.OnStop = v }),
	firstExport("nbd-device", "nbd_device", "attach the kernel's NBD client to the export as this device, e.g. /dev/nbd0 (no nbd-client needed)",
		func(e *Export, v string) error { e.NBDDevice = v; return nil }),
	firstExport("nbd-device-timeout", "nbd_device_timeout", "how long the kernel holds the NBD device's I/O while no tierblk serves it (a restart, a crash) before failing it, e.g. 2m (0: fail at once)",
		func(e *Export, v string) error { e.NBDDeviceTimeout = v; return nil }),
	firstExport("nbd-device-on-stop", "nbd_device_on_stop", "what a stop does with the NBD device: keep (attached, its I/O held for the next tierblk to take over) or release",
		func(e *Export, v string) error { e.NBDDeviceOnStop = v; return nil }),
}

// last is the value a flag given several times keeps.
func last(v []string) string { return v[len(v)-1] }

// first is the export the flags of one export set: the first, or nil where none is configured
// (Validate then says so).
func first(c *Config) *Export {
	if len(c.Exports) == 0 {
		return nil
	}
	return &c.Exports[0]
}

// firstExport declares a string flag that sets field of the first export.
func firstExport(name, field, usage string, set func(*Export, string) error) Flag {
	return Flag{Name: name, Field: "exports[0]." + field, Usage: usage,
		apply: func(c *Config, v []string, _ func(string) bool) error {
			if e := first(c); e != nil {
				return set(e, last(v))
			}
			return nil
		}}
}

// cacheFlag declares a string flag that sets field of the first export's cache, making the cache.
func cacheFlag(name, field, usage string, set func(*Cache, string)) Flag {
	return firstExport(name, "cache."+field, usage, func(e *Export, v string) error {
		if e.Cache == nil {
			e.Cache = &Cache{}
		}
		set(e.Cache, v)
		return nil
	})
}

// dirtyFlag declares a write-back watermark of the first export's cache.
func dirtyFlag(name, field string, def float64, usage string, ratio func(*WriteBack) **float64) Flag {
	f := cacheFlag(name, "write_back."+field, usage, func(c *Cache, v string) {
		x, _ := strconv.ParseFloat(v, 64)
		*ratio(&c.WriteBack) = &x
	})
	f.Kind, f.Def = Ratio64, strconv.FormatFloat(def, 'g', -1, 64)
	return f
}

// scrubFlag declares a setting of the first export's scrub schedule.
func scrubFlag(name, field, def, usage string, set func(*Scrub, string)) Flag {
	f := cacheFlag(name, "scrub."+field, usage, func(c *Cache, v string) { set(&c.Scrub, v) })
	f.Def = def
	return f
}

// ublkFlag declares a setting of the first export's ublk device, which --ublk or the file gives.
func ublkFlag(name, field, def, usage string, set func(*UBLK, int)) Flag {
	f := ublkOption(name, field, usage, func(u *UBLK, v string) {
		n, _ := strconv.Atoi(v)
		set(u, n)
	})
	f.Kind, f.Def = Int, def
	return f
}

// ublkOption declares a string flag that sets field of the first export's ublk device.
func ublkOption(name, field, usage string, set func(*UBLK, string)) Flag {
	return firstExport(name, "ublk."+field, usage, func(e *Export, v string) error {
		if e.UBLK == nil {
			return errors.New("--ublk-id, --ublk-queues, --ublk-depth and --ublk-on-stop tune the device of --ublk; give --ublk too")
		}
		set(e.UBLK, v)
		return nil
	})
}

// Override stores the flags that were given (given[name] holds a flag's values, each checked
// against its Kind) into c, loaded from a file or Defaults. Without a file, a command line that
// serves a block device and names no --nbd opens no listener, as a file that does so (Parse).
func Override(c *Config, given map[string][]string, fromFile bool) error {
	has := func(name string) bool { _, ok := given[name]; return ok }
	for _, f := range Flags {
		if v, ok := given[f.Name]; ok {
			if err := f.apply(c, v, has); err != nil {
				return err
			}
		}
	}
	if !has("nbd") && !fromFile && c.servesDevices() {
		c.Listen = nil
	}
	return nil
}

// rename replaces what re matches with with.
type rename struct {
	re   *regexp.Regexp
	with string
}

// flagRenames turn, in an error about a command line, the fields of Flags into their flags, and
// the daemon's prefixes for the first export into the flag that made it.
var flagRenames = func() []rename {
	var r []rename
	add := func(pattern, with string) { r = append(r, rename{regexp.MustCompile(pattern), with}) }
	for _, f := range Flags {
		if f.Field == "" {
			continue
		}
		// A field of an export may stand inside a message; a top-level one ("admin") only at
		// the start of a line, where an error names it, not in the message's words.
		before := `(^|[\s(])`
		if !strings.ContainsAny(f.Field, ".[") {
			before = `(^)`
		}
		// Any index for "[]"; a field that ends in a letter must end there ("ssd", not "ssd_size").
		field := strings.ReplaceAll(regexp.QuoteMeta(f.Field), `\[\]`, `\[\d+\]`)
		if !strings.HasSuffix(f.Field, "]") {
			field += `\b`
		}
		add(`(?m)`+before+field, "${1}--"+f.Name)
	}
	for _, f := range Flags {
		// The daemon's errors about a setting of the export ("exports[0] (""): record_trace: ...").
		if field, ok := strings.CutPrefix(f.Field, "exports[0]."); ok && !strings.ContainsAny(field, ".[") {
			add(`exports\[0\] \("[^"]*"\): `+regexp.QuoteMeta(field)+`: `, "--"+f.Name+": ")
		}
	}
	add(`exports\[0\] \("[^"]*"\)`, "--backend") // the daemon's errors opening the export's backend
	add(`exports\[0\]\.cache: `, "")             // and making its cache
	add(`(?m)^listen: no listen address`, "no listen address")
	add(`(?m)^allow: `, "--allow: ") // the list as a whole, not one of its entries
	return r
}()

// FlagNames rewrites msg, an error about a configuration made by flags alone, to name the flags
// rather than the fields they set.
func FlagNames(msg string) string {
	for _, r := range flagRenames {
		msg = r.re.ReplaceAllString(msg, r.with)
	}
	return msg
}
