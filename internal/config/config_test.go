package config

import (
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/cache"
)

var schemes = []string{"file", "mem", "nbd", "nbd+unix"}

func TestExampleConfigIsValid(t *testing.T) {
	c, err := Load("../../configs/tierblk.example.yaml")
	require.NoError(t, err)
	require.NoError(t, c.Validate(schemes))
	require.Len(t, c.Exports, 3)
	require.Equal(t, "nas", c.Exports[0].Name)
	require.True(t, c.Exports[2].ReadOnly)
	every, rate, err := c.Exports[0].Cache.Scrub.Schedule()
	require.NoError(t, err)
	require.Equal(t, [2]int64{int64(DefaultScrubEvery), DefaultScrubRate}, [2]int64{int64(every), rate}, "the example shows the defaults")
	require.Equal(t, []string{"unix:/run/tierblk/tierblk.sock", "127.0.0.1:10809"}, c.Listen)
}

// The TLS settings in a file: absent, TLS is off; YAML's bare on and off are the modes' names.
func TestParseTLS(t *testing.T) {
	c, err := Parse([]byte("tls: {certificates: /etc/pki/tierblk}\n"), "test.yaml")
	require.NoError(t, err)
	require.Equal(t, TLS{Mode: "off", Certificates: "/etc/pki/tierblk"}, c.TLS)
	for _, mode := range []string{"off", "on", "require"} {
		c, err := Parse([]byte("tls:\n  mode: "+mode+"\n  certificates: /d\n"), "test.yaml")
		require.NoError(t, err)
		require.Equal(t, mode, c.TLS.Mode)
	}
	c, err = Parse([]byte("tls: {mode: require, certificates: /d, verify_peer: true}\n"), "test.yaml")
	require.NoError(t, err)
	require.Equal(t, TLS{Mode: "require", Certificates: "/d", VerifyPeer: true}, c.TLS)
}

// Every error in a config file says where it is (file:line), which field (its YAML path), and what
// would be valid; yaml.v3's own messages name Go types, and put some syntax errors a line early.
func TestParseErrors(t *testing.T) {
	for _, tc := range []struct {
		name, yaml, want string
	}{
		{"unknown field, close to one",
			"exports:\n  - name: a\n    cache:\n      ssd_sise: 1GiB\n",
			"config t.yaml:4: exports[0].cache.ssd_sise: unknown field; did you mean ssd_size?"},
		{"unknown field, a swap and a dash",
			"lsiten: [x]\nlog-level: info\n",
			"config t.yaml:1: lsiten: unknown field; did you mean listen?\nconfig t.yaml:2: log-level: unknown field; did you mean log_level?"},
		{"unknown field, close to none",
			"exports:\n  - name: a\n    ublk:\n      cpus: 4\n",
			"config t.yaml:4: exports[0].ublk.cpus: unknown field; the fields of exports[0].ublk are id, queues, depth, on_stop"},
		{"unknown top-level field",
			"exports: []\ncolour: blue\n",
			"config t.yaml:2: colour: unknown field; the top-level fields are exports, listen, allow, socket_mode, socket_group, log_level, max_in_flight, admin, metrics, tls, run_dir, lock_memory"},
		{"a single value for a list",
			"listen: unix:/run/x.sock\n",
			"config t.yaml:1: listen: expected a list, not the single value \"unix:/run/x.sock\"; write `listen: [unix:/run/x.sock]`, or a `- unix:/run/x.sock` line per item under listen:"},
		{"a mapping for a list of strings",
			"log_level: info\nallow:\n  lan: 10.0.0.0/8\n",
			"config t.yaml:3: allow: expected a list, not a mapping; write `allow: [a, b]`, or a `- item` line per item under allow:"},
		{"exports not a list",
			"exports:\n  name: a\n  backend: mem://1GiB\n",
			"config t.yaml:2: exports: expected a list, not a mapping; begin each item with \"- \": `- name: ...` under exports:, the item's other fields indented to line up with name"},
		{"a single value for a mapping",
			"exports:\n  - backend: mem://1GiB\n    ublk: true\n",
			"config t.yaml:3: exports[0].ublk: expected a mapping of its fields, not the single value \"true\"; write `ublk: {}` for the defaults, or `field: value` lines indented under ublk:"},
		{"a mapping for a single value",
			"log_level:\n  level: info\n",
			"config t.yaml:2: log_level: expected a single value, not a mapping (quote a value that holds \": \" or starts with [ or {)"},
		{"not a whole number", "max_in_flight: lots\n", `config t.yaml:1: max_in_flight: "lots" is not a whole number`},
		{"not a bool", "exports:\n  - name: a\n    read_only: maybe\n", `config t.yaml:3: exports[0].read_only: "maybe" is not true or false`},
		{"not a number", "exports:\n  - cache:\n      write_back: {high: half}\n", `config t.yaml:3: exports[0].cache.write_back.high: "half" is not a number`},
		{"given twice", "listen: [a]\nlog_level: info\nlisten: [b]\n", "config t.yaml:3: listen: given twice (first on line 1); keep one"},
		{"through a merge key",
			"exports:\n  - &e {name: a, backend: 'mem://1GiB'}\n  - <<: *e\n    name: b\n    bakend: x\n",
			"config t.yaml:5: exports[1].bakend: unknown field; did you mean backend?"},
		{"the file not a mapping", "- a\n",
			"config t.yaml:1: the file must be a mapping of settings (exports, listen, allow, socket_mode, socket_group, log_level, max_in_flight, admin, metrics, tls, run_dir, lock_memory), not a list"},
		// Syntax errors, each on the line of the problem; yaml.v3's line in the comment.
		{"tab in a value's indentation", // 2: the line of the value the tab breaks
			"exports:\n  - name: a\n\tbackend: mem://1GiB\n",
			"config t.yaml:3: a tab in the indentation; YAML indents with spaces only"},
		{"tab before a key", // 3
			"log_level: info\nlisten: []\n\tadmin: x\n",
			"config t.yaml:3: a tab in the indentation; YAML indents with spaces only"},
		{"a list item in a mapping", // 2: the parser's lines count from 0
			"log_level: info\nlisten: []\n- b\n",
			"config t.yaml:3: did not find expected key"},
		{"an item out of line", // 2: the line before the list's
			"log_level: info\nexports:\n  - name: a\n  backend: b\n",
			"config t.yaml:4: did not find expected '-' indicator"},
		{"a quote not closed on the first line", // 3: the end, as the context on line 0 is taken for none
			"log_level: 'info\nlisten: []\n",
			"config t.yaml:1: a quoted value is not closed: the file ends inside it"},
		{"a quote not closed", // 2
			"listen: []\nlog_level: \"info\n\nadmin: x\n",
			"config t.yaml:2: a quoted value is not closed: the file ends inside it"},
		{"an unknown anchor", // none
			"log_level: &l info\nadmin: *a\n",
			"config t.yaml:2: unknown anchor 'a' referenced"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.yaml), "t.yaml")
			require.EqualError(t, err, tc.want)
		})
	}
}

// A field error in a file is a config.Error, as a validation error is.
func TestParseErrorIsAFieldError(t *testing.T) {
	_, err := Parse([]byte("exports:\n  - backnd: x\n"), "t.yaml")
	var fe *Error
	require.ErrorAs(t, err, &fe)
	require.Equal(t, "exports[0].backnd", fe.Field)
}

// Whatever decodes today decodes the same: the check does not stand in yaml.v3's way.
func TestParseEmptyAndNull(t *testing.T) {
	for _, text := range []string{"", "# nothing\n", "~\n", "exports:\n"} {
		c, err := Parse([]byte(text), "t.yaml")
		require.NoError(t, err, "%q", text)
		require.Equal(t, Defaults().Listen, c.Listen, "%q", text)
	}
}

func TestValidateNamesTheField(t *testing.T) {
	good := func() Config {
		c := Defaults()
		c.Exports = []Export{{Name: "a", Backend: "mem://1GiB"}}
		return c
	}
	for _, tc := range []struct {
		name   string
		mutate func(*Config)
		want   string
	}{
		{"no exports", func(c *Config) { c.Exports = nil }, "exports: no export"},
		{"no backend", func(c *Config) { c.Exports[0].Backend = "" }, "exports[0].backend: missing"},
		{"unknown scheme", func(c *Config) { c.Exports[0].Backend = "tape:///dev/st0" }, `exports[0].backend: "tape:///dev/st0" has unknown scheme "tape"`},
		{"bad url", func(c *Config) { c.Exports[0].Backend = "file://%zz" }, "exports[0].backend"},
		{"password hidden", func(c *Config) { c.Exports[0].Backend = "tape://alice:s3cret@nas/x" }, `exports[0].backend: "tape://alice:xxxxx@nas/x" has unknown scheme`},
		{"duplicate name", func(c *Config) { c.Exports = append(c.Exports, Export{Name: "a", Backend: "mem://1MiB"}) }, "exports[1].name"},
		{"SSD on the backend's file", func(c *Config) {
			c.Exports[0].Backend = "file:///srv/nas.img"
			c.Exports[0].Cache = &Cache{SSD: "/srv/nas.img"}
		}, `exports[0].cache.ssd: /srv/nas.img is also the export's backend; an SSD tier needs a file or device of its own`},
		{"no tier", func(c *Config) { c.Exports[0].Cache = &Cache{RAM: "0"} }, "exports[0].cache.ram: a cache needs a RAM tier, an SSD tier or both"},
		{"one file, two exports", func(c *Config) {
			c.Exports[0].Backend = "file:///srv/nas.img?size=1GiB"
			c.Exports = append(c.Exports, Export{Name: "b", Backend: "file:///srv/../srv/nas.img", ReadOnly: true})
		}, `exports[1].backend: the file /srv/nas.img is also the backend of exports[0] ("a"); one export a file, unless every export of it is read_only`},
		{"no listen", func(c *Config) { c.Listen = nil }, "listen: no listen address"},
		{"bad listen", func(c *Config) { c.Listen = []string{"localhost"} }, "listen[0]"},
		{"empty unix", func(c *Config) { c.Listen = []string{"unix:"} }, "listen[0]"},
		{"duplicate listen", func(c *Config) { c.Listen = []string{"unix:/a", "unix:/a"} }, "listen[1]"},
		{"bad level", func(c *Config) { c.LogLevel = "loud" }, "log_level"},
		{"allow not a network", func(c *Config) { c.Allow = []string{"10.0.0.0/8", "lan"} }, `allow[1]: "lan" is not an IP address or a network`},
		{"allow without a TCP listener", func(c *Config) { c.Listen, c.Allow = []string{"unix:/a"}, []string{"10.0.0.0/8"} }, "allow: is set but no listen address is HOST:PORT"},
		{"socket mode not octal", func(c *Config) { c.Listen, c.SocketMode = []string{"unix:/a"}, "rw-rw----" }, `socket_mode: "rw-rw----" is not permission bits`},
		{"socket mode without a unix listener", func(c *Config) { c.SocketMode = "0660" }, "socket_mode: is set but no listen address is unix:/path"},
		{"socket group without a unix listener", func(c *Config) { c.SocketGroup = "disk" }, "socket_group: is set but no listen address is unix:/path"},
		{"in flight", func(c *Config) { c.MaxInFlight = 0 }, "max_in_flight"},
		{"admin on the LAN", func(c *Config) { c.Admin = "0.0.0.0:9000" }, "admin: "},
		{"cache without tiers", func(c *Config) { c.Exports[0].Cache = &Cache{} }, "exports[0].cache.ram: a cache needs"},
		{"cache mode", func(c *Config) { c.Exports[0].Cache = &Cache{RAM: "1GiB", Mode: "writeback2"} }, "exports[0].cache.mode: unknown cache mode"},
		{"cache line not a power of two", func(c *Config) { c.Exports[0].Cache = &Cache{RAM: "1GiB", Line: "48KiB"} }, "exports[0].cache.line"},
		{"cache line too big", func(c *Config) { c.Exports[0].Cache = &Cache{RAM: "1GiB", Line: "2MiB"} }, "exports[0].cache.line"},
		{"cache ram below a line", func(c *Config) { c.Exports[0].Cache = &Cache{RAM: "4KiB"} }, "exports[0].cache.ram"},
		{"cache ram not a size", func(c *Config) { c.Exports[0].Cache = &Cache{RAM: "lots"} }, "exports[0].cache.ram"},
		{"cache ram in decimal units", func(c *Config) { c.Exports[0].Cache = &Cache{RAM: "64MB"} },
			`exports[0].cache.ram: size "64MB": decimal units are not accepted (64MB would be 64000000 bytes); write 64MiB (67108864 bytes), or a number of bytes`},
		{"cache ram between lines", func(c *Config) { c.Exports[0].Cache = &Cache{RAM: "100000000"} },
			`exports[0].cache.ram: "100000000" is not a whole number of lines (64KiB); use 97600KiB (99942400 bytes) or 97664KiB (100007936 bytes)`},
		{"cache ram between lines of another size", func(c *Config) { c.Exports[0].Cache = &Cache{RAM: "1.5MiB", Line: "1MiB"} },
			`exports[0].cache.ram: "1.5MiB" is not a whole number of lines (1MiB); use 1MiB (1048576 bytes) or 2MiB (2097152 bytes)`},
		{"cache ssd_size between lines", func(c *Config) { c.Exports[0].Cache = &Cache{SSD: "/x", SSDSize: "1000000000"} },
			`exports[0].cache.ssd_size: "1000000000" is not a whole number of lines (64KiB); use 976512KiB (999948288 bytes) or 976576KiB (1000013824 bytes)`},
		{"cache ssd_size in decimal units", func(c *Config) { c.Exports[0].Cache = &Cache{SSD: "/x", SSDSize: "1TB"} },
			`exports[0].cache.ssd_size: size "1TB": decimal units are not accepted`},
		{"scrub rate in decimal units", func(c *Config) { c.Exports[0].Cache = &Cache{SSD: "/x", Scrub: Scrub{Rate: "100MB/s"}} },
			`exports[0].cache.scrub.rate: rate "100MB/s": decimal units are not accepted (100MB/s would be 100000000 bytes a second); write 100MiB/s (104857600 bytes a second), or a number of bytes a second (default 64MiB/s)`},
		{"ssd_size without ssd", func(c *Config) { c.Exports[0].Cache = &Cache{RAM: "1GiB", SSDSize: "1GiB"} }, "exports[0].cache.ssd_size"},
		{"ssd_size below two lines", func(c *Config) { c.Exports[0].Cache = &Cache{SSD: "/x", SSDSize: "64KiB"} }, "exports[0].cache.ssd_size: \"64KiB\" is less than two lines"},
		{"congestion not a duration", func(c *Config) { c.Exports[0].Cache = &Cache{SSD: "/x", Congestion: "2"} }, `exports[0].cache.congestion: "2": use a duration`},
		{"congestion negative", func(c *Config) { c.Exports[0].Cache = &Cache{SSD: "/x", Congestion: "-2ms"} }, `exports[0].cache.congestion: "-2ms"`},
		{"congestion without ssd", func(c *Config) { c.Exports[0].Cache = &Cache{RAM: "1GiB", Congestion: "off"} }, "exports[0].cache.congestion: is set but ssd is not"},
		{"reduction unknown", func(c *Config) { c.Exports[0].Cache = &Cache{SSD: "/x", Reduction: "zeros"} }, `exports[0].cache.reduction: unknown reduction "zeros"; use off, zero, compress or dedupe`},
		{"reduction without ssd", func(c *Config) { c.Exports[0].Cache = &Cache{RAM: "1GiB", Reduction: "off"} }, "exports[0].cache.reduction: is set but ssd is not"},
		{"scrub every negative", func(c *Config) { c.Exports[0].Cache = &Cache{SSD: "/x", Scrub: Scrub{Every: "-1h"}} },
			`exports[0].cache.scrub.every: "-1h": use a duration such as 168h or 24h (default 168h), or 0 for no scheduled scrub`},
		{"scrub every in days", func(c *Config) { c.Exports[0].Cache = &Cache{SSD: "/x", Scrub: Scrub{Every: "7d"}} }, `exports[0].cache.scrub.every: "7d": use a duration`},
		{"scrub rate not a size", func(c *Config) { c.Exports[0].Cache = &Cache{SSD: "/x", Scrub: Scrub{Rate: "fast"}} },
			`exports[0].cache.scrub.rate: rate "fast" is not a size a second (size "fast" is not a number with an optional unit (KiB, MiB, GiB, TiB)); write e.g. 64MiB/s, or 0 for no limit (default 64MiB/s)`},
		{"scrub rate per minute", func(c *Config) { c.Exports[0].Cache = &Cache{SSD: "/x", Scrub: Scrub{Rate: "1GiB/min"}} }, `exports[0].cache.scrub.rate: rate "1GiB/min"`},
		{"scrub rate negative", func(c *Config) { c.Exports[0].Cache = &Cache{SSD: "/x", Scrub: Scrub{Rate: "-64MiB/s"}} }, `exports[0].cache.scrub.rate: rate "-64MiB/s" is not a size a second (size "-64MiB" is negative)`},
		{"scrub every and rate", func(c *Config) { c.Exports[0].Cache = &Cache{SSD: "/x", Scrub: Scrub{Every: "often", Rate: "fast"}} },
			"exports[0].cache.scrub.every: \"often\": use a duration such as 168h or 24h (default 168h), or 0 for no scheduled scrub\nexports[0].cache.scrub.rate: rate \"fast\""},
		{"scrub without ssd", func(c *Config) { c.Exports[0].Cache = &Cache{RAM: "1GiB", Scrub: Scrub{Every: "24h"}} },
			"exports[0].cache.scrub.every: is set but ssd is not; a scrub checks the blocks the SSD tier stores"},
		{"policy", func(c *Config) { c.Exports[0].Cache = &Cache{RAM: "1GiB", Policy: "mru"} }, "exports[0].cache.policy: unknown eviction policy"},
		{"ssd policy", func(c *Config) { c.Exports[0].Cache = &Cache{RAM: "1GiB", SSDPolicy: "mru"} }, "exports[0].cache.ssd_policy"},
		{"admission", func(c *Config) { c.Exports[0].Cache = &Cache{RAM: "1GiB", RAMAdmission: "nhit:zero"} }, "exports[0].cache.ram_admission"},
		{"writeback without ssd", func(c *Config) { c.Exports[0].Cache = &Cache{RAM: "1GiB", Mode: "writeback"} }, "exports[0].cache.mode: writeback needs an SSD tier"},
		{"write_back max above 1", func(c *Config) { c.Exports[0].Cache = &Cache{RAM: "1GiB", WriteBack: WriteBack{Max: Ratio(1.5)}} }, "exports[0].cache.write_back.max: 1.5 is out of range"},
		{"write_back low negative", func(c *Config) { c.Exports[0].Cache = &Cache{RAM: "1GiB", WriteBack: WriteBack{Low: Ratio(-0.1)}} }, "exports[0].cache.write_back.low: -0.1 is out of range"},
		{"write_back low above default high", func(c *Config) { c.Exports[0].Cache = &Cache{RAM: "1GiB", WriteBack: WriteBack{Low: Ratio(0.6)}} }, "exports[0].cache.write_back.low: 0.6 must be below high (0.5)"},
		{"write_back high below default low", func(c *Config) { c.Exports[0].Cache = &Cache{RAM: "1GiB", WriteBack: WriteBack{High: Ratio(0.2)}} }, "exports[0].cache.write_back.high: 0.2 must be above low"},
		{"write_back high above max", func(c *Config) {
			c.Exports[0].Cache = &Cache{RAM: "1GiB", WriteBack: WriteBack{High: Ratio(0.8), Max: Ratio(0.7)}}
		}, "exports[0].cache.write_back.high: 0.8 must be at most max (0.7)"},
		{"write_back max below default high", func(c *Config) { c.Exports[0].Cache = &Cache{RAM: "1GiB", WriteBack: WriteBack{Max: Ratio(0.4)}} }, "exports[0].cache.write_back.max: 0.4 must be at least high"},
		{"write_back high 0", func(c *Config) { c.Exports[0].Cache = &Cache{RAM: "1GiB", WriteBack: WriteBack{High: Ratio(0)}} }, "exports[0].cache.write_back.high: 0 must be above low (0.25, the default)"},
		{"write_back destage", func(c *Config) { c.Exports[0].Cache = &Cache{RAM: "1GiB", WriteBack: WriteBack{Destage: "lazy"}} }, `exports[0].cache.write_back.destage: unknown policy "lazy"`},
		{"write_back throttle", func(c *Config) { c.Exports[0].Cache = &Cache{RAM: "1GiB", WriteBack: WriteBack{Throttle: "hard"}} }, `exports[0].cache.write_back.throttle: unknown policy "hard"`},
		{"write_back order", func(c *Config) { c.Exports[0].Cache = &Cache{RAM: "1GiB", WriteBack: WriteBack{Order: "fifo"}} }, `exports[0].cache.write_back.order: "fifo": use address`},
		{"write_back replicas without write-back", func(c *Config) {
			c.Exports[0].Cache = &Cache{SSD: "/ssd", WriteBack: WriteBack{Replicas: []string{"nbd://b:10810/nas"}}}
		}, "exports[0].cache.write_back.replicas: replicas hold write-back's dirty data: set mode: writeback too"},
		{"write_back replica URL", func(c *Config) {
			c.Exports[0].Cache = &Cache{SSD: "/ssd", Mode: "writeback", WriteBack: WriteBack{Replicas: []string{"b:10810"}}}
		}, `exports[0].cache.write_back.replicas[0]: "b:10810": give the replica's NBD URL`},
		{"write_back three replicas", func(c *Config) {
			c.Exports[0].Cache = &Cache{SSD: "/ssd", Mode: "writeback", WriteBack: WriteBack{Replicas: []string{"nbd://a/x", "nbd://b/x", "nbd://c/x"}}}
		}, "exports[0].cache.write_back.replicas: 3 replicas: give one or two"},
		{"write_back on_replica_loss", func(c *Config) {
			c.Exports[0].Cache = &Cache{SSD: "/ssd", Mode: "writeback", WriteBack: WriteBack{OnReplicaLoss: "panic"}}
		}, `exports[0].cache.write_back.on_replica_loss: "panic": use writethrough`},
		{"ublk id", func(c *Config) { id := -2; c.Exports[0].UBLK = &UBLK{ID: &id} }, "exports[0].ublk.id: -2 is out of range"},
		{"ublk queues", func(c *Config) { c.Exports[0].UBLK = &UBLK{Queues: 5000} }, "exports[0].ublk.queues: 5000 is out of range"},
		{"ublk depth", func(c *Config) { c.Exports[0].UBLK = &UBLK{Depth: -1} }, "exports[0].ublk.depth: -1 is out of range"},
		{"ublk on_stop", func(c *Config) { c.Exports[0].UBLK = &UBLK{OnStop: "detach"} }, `exports[0].ublk.on_stop: "detach": use keep or remove`},
		{"ublk kept without an id", func(c *Config) { c.Exports[0].UBLK = &UBLK{OnStop: "keep"} }, "exports[0].ublk.on_stop: keep needs a fixed device number"},
		{"shared ublk id", func(c *Config) {
			id := 3
			c.Exports[0].UBLK = &UBLK{ID: &id}
			c.Exports = append(c.Exports, Export{Name: "b", Backend: "mem://1MiB", UBLK: &UBLK{ID: &id}})
		}, "exports[1].ublk.id: 3 is also the ublk device of exports[0]"},
		{"nbd device path", func(c *Config) { c.Exports[0].NBDDevice = "/dev/sda" }, `exports[0].nbd_device: "/dev/sda" is not a kernel NBD device`},
		{"shared nbd device", func(c *Config) {
			c.Exports[0].NBDDevice = "/dev/nbd1"
			c.Exports = append(c.Exports, Export{Name: "b", Backend: "mem://1MiB", NBDDevice: "/dev/nbd1"})
		}, "exports[1].nbd_device"},
		{"nbd device timeout", func(c *Config) {
			c.Exports[0].NBDDevice, c.Exports[0].NBDDeviceTimeout = "/dev/nbd1", "1.5s"
		}, `exports[0].nbd_device_timeout: "1.5s": use whole seconds`},
		{"nbd device on stop", func(c *Config) {
			c.Exports[0].NBDDevice, c.Exports[0].NBDDeviceOnStop = "/dev/nbd1", "detach"
		}, `exports[0].nbd_device_on_stop: "detach": use keep or release`},
		{"ssd over mem", func(c *Config) { c.Exports[0].Cache = &Cache{SSD: "/ssd"} }, "exports[0].cache.ssd: the backend \"mem://1GiB\" loses its data"},
		{"shared ssd", func(c *Config) {
			c.Exports[0].Backend = "file:///a"
			c.Exports[0].Cache = &Cache{SSD: "/ssd"}
			c.Exports = append(c.Exports, Export{Name: "b", Backend: "file:///b", Cache: &Cache{SSD: "/ssd"}})
		}, "exports[1].cache.ssd"},
		{"tls mode", func(c *Config) { c.TLS.Mode = "yes" }, `tls.mode: "yes" is not a TLS mode; use off, on or require`},
		{"tls without certificates", func(c *Config) { c.TLS.Mode = "require" }, "tls.certificates: missing; with tls.mode require, give the directory"},
		{"verify_peer without tls", func(c *Config) { c.TLS.VerifyPeer = true }, "tls.verify_peer: checks the certificates of TLS clients, and tls.mode is off: set tls.mode to on or require"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := good()
			require.NoError(t, c.Validate(schemes))
			tc.mutate(&c)
			require.ErrorContains(t, c.Validate(schemes), tc.want)
		})
	}
}

// TestDevicesWithoutListener: an export served as a block device needs no NBD listener.
func TestDevicesWithoutListener(t *testing.T) {
	for _, e := range []Export{
		{Backend: "mem://1MiB", UBLK: &UBLK{}},
		{Backend: "mem://1MiB", NBDDevice: "/dev/nbd0"},
	} {
		c := Defaults()
		c.Listen = nil
		c.Exports = []Export{e}
		require.NoError(t, c.Validate(schemes))
		require.Equal(t, -1, e.UBLK.DeviceID())
	}
	c, err := Parse([]byte("exports: [{backend: 'mem://1MiB', ublk: {id: 2, queues: 4}}]\nlisten: []\n"), "t.yaml")
	require.NoError(t, err)
	require.NoError(t, c.Validate(schemes))
	require.Equal(t, 2, c.Exports[0].UBLK.DeviceID())
	require.Equal(t, 4, c.Exports[0].UBLK.Queues)
}

func TestWriteBackAccepted(t *testing.T) {
	c := Defaults()
	c.Exports = []Export{{Name: "a", Backend: "file:///a", Cache: &Cache{SSD: "/ssd", Mode: "writeback",
		WriteBack: WriteBack{High: Ratio(0.6), Low: Ratio(0.1), Max: Ratio(0.95), Destage: "watermark", Throttle: "none"}}}}
	require.NoError(t, c.Validate(schemes))
	require.Equal(t, cache.WriteBackConfig{High: 0.6, Low: 0.1, Max: 0.95, Destage: "watermark", Throttle: "none"},
		c.Exports[0].Cache.WriteBack.Engine())
}

// TestWriteBackZero: a watermark given as 0 is taken as given, one left out takes its default.
func TestWriteBackZero(t *testing.T) {
	c, err := Parse([]byte("exports: [{backend: 'file:///a', cache: {ssd: /ssd, mode: writeback, write_back: {low: 0}}}]\n"), "t.yaml")
	require.NoError(t, err)
	require.NoError(t, c.Validate(schemes))
	d := cache.DefaultWriteBack
	require.Equal(t, cache.WriteBackConfig{High: d.High, Low: 0, Max: d.Max}, c.Exports[0].Cache.WriteBack.Engine())
}

func TestParseAllow(t *testing.T) {
	for _, tc := range []struct {
		in, want, err string
	}{
		{in: "10.0.0.0/8", want: "10.0.0.0/8"},
		{in: "192.168.1.7", want: "192.168.1.7/32"},
		{in: "192.168.1.7/32", want: "192.168.1.7/32"},
		{in: "0.0.0.0/0", want: "0.0.0.0/0"},
		{in: "fd00::/64", want: "fd00::/64"},
		{in: "::1", want: "::1/128"},
		{in: "", err: `"" is not an IP address or a network`},
		{in: "lan", err: `"lan" is not an IP address or a network`},
		{in: "nas.local", err: `"nas.local" is not an IP address or a network`},
		{in: " 10.0.0.1", err: `" 10.0.0.1" is not an IP address`},
		{in: "10.0.0.0/33", err: `"10.0.0.0/33" is not a network in CIDR notation`},
		{in: "10.0.0.0/", err: "not a network in CIDR notation"},
		{in: "10/8", err: "not a network in CIDR notation"},
		{in: "10.0.0.1/8", err: `"10.0.0.1/8" has bits set past its /8: write 10.0.0.0/8 for the network, or 10.0.0.1 for the one address`},
		{in: "fe80::1%eth0", err: "is not an IP address or a network"},
		{in: "::ffff:10.0.0.1", err: "IPv4-mapped"},
		{in: "::ffff:10.0.0.0/104", err: "IPv4-mapped"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			p, err := ParseAllow(tc.in)
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, p.String())
		})
	}
}

func TestParseSocketMode(t *testing.T) {
	for in, want := range map[string]fs.FileMode{"0660": 0o660, "660": 0o660, "0600": 0o600, "0777": 0o777, "0": 0} {
		m, err := ParseSocketMode(in)
		require.NoError(t, err, in)
		require.Equal(t, want, m, in)
	}
	for _, in := range []string{"", "0o660", "rw-rw----", "0680", "1777", "4660", "-1", "0x1b6"} {
		_, err := ParseSocketMode(in)
		require.ErrorContains(t, err, fmt.Sprintf("%q is not permission bits in octal", in))
	}
}

// TestAccessFromFile: the settings of who may connect, as a config file gives them.
func TestAccessFromFile(t *testing.T) {
	c, err := Parse([]byte(`
exports: [{backend: 'mem://1MiB'}]
listen: [unix:/run/t.sock, '0.0.0.0:10809']
allow: [192.168.1.0/24, 10.1.2.3, 'fd00::/64']
socket_mode: 0660
socket_group: disk
`), "t.yaml")
	require.NoError(t, err)
	require.NoError(t, c.Validate(schemes))
	ps, err := c.AllowPrefixes()
	require.NoError(t, err)
	require.Equal(t, []netip.Prefix{netip.MustParsePrefix("192.168.1.0/24"), netip.MustParsePrefix("10.1.2.3/32"), netip.MustParsePrefix("fd00::/64")}, ps)
	require.Equal(t, "0660", c.SocketMode, "an unquoted mode is kept as written, not read as a YAML number")
	require.Equal(t, "disk", c.SocketGroup)
}

func TestParseListenAddr(t *testing.T) {
	for in, want := range map[string][2]string{
		"unix:/run/x.sock": {"unix", "/run/x.sock"},
		"unix:rel.sock":    {"unix", "rel.sock"},
		"127.0.0.1:10809":  {"tcp", "127.0.0.1:10809"},
		":10809":           {"tcp", ":10809"},
		"[::1]:10809":      {"tcp", "[::1]:10809"},
	} {
		n, a, err := ParseListenAddr(in)
		require.NoError(t, err, in)
		require.Equal(t, want, [2]string{n, a}, in)
	}
}

func TestLoadMissingFile(t *testing.T) {
	_, err := Load(t.TempDir() + "/nope.yaml")
	require.ErrorIs(t, err, os.ErrNotExist)
}

func TestEmptyFileGivesDefaults(t *testing.T) {
	c, err := Parse(nil, "empty.yaml")
	require.NoError(t, err)
	require.Equal(t, Defaults(), c)
}

func TestCacheDefaults(t *testing.T) {
	c := Cache{SSD: "/srv/ssd.img", Policy: "s3fifo", RAMPolicy: "lru", Admission: "nhit:2"}
	s, err := c.Sizes()
	require.NoError(t, err)
	require.Equal(t, CacheSizes{Line: 64 << 10}, s)
	require.Equal(t, "/srv/ssd.img.meta", c.MetaDir())
	rp, ra, sp, sa := c.TierPolicies()
	require.Equal(t, [4]string{"lru", "nhit:2", "s3fifo", "nhit:2"}, [4]string{rp, ra, sp, sa})
}

func TestCongestionThreshold(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Duration
	}{{"", 0}, {"off", -1}, {"500us", 500 * time.Microsecond}, {"20ms", 20 * time.Millisecond}} {
		d, err := (&Cache{Congestion: tc.in}).CongestionThreshold()
		require.NoError(t, err, "congestion %q", tc.in)
		require.Equal(t, tc.want, d, "congestion %q", tc.in)
	}
}

// TestListenDefault: a config without listen opens the default NBD listener, unless an export is
// served as a block device of this machine; listen given is taken as given.
func TestListenDefault(t *testing.T) {
	for _, tc := range []struct {
		yaml string
		want []string
	}{
		{"exports: [{backend: 'mem://1MiB'}]", []string{"127.0.0.1:10809"}},
		{"exports: [{backend: 'mem://1MiB', ublk: {}}]", nil},
		{"exports: [{backend: 'mem://1MiB', nbd_device: /dev/nbd0}]", nil},
		{"exports: [{backend: 'mem://1MiB', ublk: {}}]\nlisten: ['127.0.0.1:10900']", []string{"127.0.0.1:10900"}},
	} {
		c, err := Parse([]byte(tc.yaml), "t.yaml")
		require.NoError(t, err, tc.yaml)
		require.Equal(t, tc.want, c.Listen, tc.yaml)
	}
}

// A password that url.Parse would refuse (libiscsi's USER%PASSWORD, where '%' separates) is left
// to the backend's own parser.
func TestBackendURLWithLibiscsiPassword(t *testing.T) {
	c := Defaults()
	c.Exports = []Export{{Name: "a", Backend: "iscsi://alice%pa%ss@nas/iqn.2001-04.com.example:disk/1"}}
	require.NoError(t, c.Validate(append(schemes, "iscsi")))
}

func TestNBDDeadConnTimeout(t *testing.T) {
	for in, want := range map[string]time.Duration{"": DefaultNBDDeviceTimeout, "0": 0, "5m": 5 * time.Minute, "3s": 3 * time.Second} {
		e := Export{NBDDeviceTimeout: in}
		got, err := e.NBDDeadConnTimeout()
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	require.True(t, (&Export{}).KeepNBDDevice())
	require.False(t, (&Export{NBDDeviceOnStop: "release"}).KeepNBDDevice())
}

// A ublk device is kept on stop where it can be taken back (a fixed ID), unless asked otherwise.
func TestUBLKKeepOnStop(t *testing.T) {
	id := 0
	require.False(t, (*UBLK)(nil).KeepOnStop())
	require.False(t, (&UBLK{}).KeepOnStop(), "a device the kernel numbered cannot be taken back")
	require.True(t, (&UBLK{ID: &id}).KeepOnStop())
	require.False(t, (&UBLK{ID: &id, OnStop: "remove"}).KeepOnStop())
	require.True(t, (&UBLK{ID: &id, OnStop: "keep"}).KeepOnStop())
	c, err := Parse([]byte("exports: [{backend: 'mem://1MiB', ublk: {id: 2, on_stop: remove}}]\nlisten: []\n"), "t.yaml")
	require.NoError(t, err)
	require.NoError(t, c.Validate(schemes))
	require.False(t, c.Exports[0].UBLK.KeepOnStop())
}

func TestReductionLevel(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want cache.Reduction
	}{{"", cache.ReductionCompress}, {"off", cache.ReductionOff}, {"zero", cache.ReductionZero},
		{"compress", cache.ReductionCompress}, {"dedupe", cache.ReductionDedupe}} {
		r, err := (&Cache{Reduction: tc.in}).ReductionLevel()
		require.NoError(t, err, "reduction %q", tc.in)
		require.Equal(t, tc.want, r, "reduction %q", tc.in)
	}
	// An unknown name is refused with cache.ParseReduction's error, which names every reduction.
	_, err := (&Cache{Reduction: "dedup"}).ReductionLevel()
	_, perr := cache.ParseReduction("dedup")
	require.EqualError(t, err, "reduction: "+perr.Error())
	require.EqualError(t, perr, `unknown reduction "dedup"; use off, zero, compress or dedupe`)
}

// TestReductionDedupeAccepted: a config file that asks for dedupe validates, and the export's
// cache gets cache.ReductionDedupe.
func TestReductionDedupeAccepted(t *testing.T) {
	c, err := Parse([]byte("exports: [{backend: 'file:///a', cache: {ssd: /ssd, mode: writeback, reduction: dedupe}}]\n"), "t.yaml")
	require.NoError(t, err)
	require.NoError(t, c.Validate(schemes))
	r, err := c.Exports[0].Cache.ReductionLevel()
	require.NoError(t, err)
	require.Equal(t, cache.ReductionDedupe, r)
}

// TestScrubSchedule: the scrub's schedule from the config file: the defaults when absent, 0 as
// given (never; no limit), a rate with or without "/s".
func TestScrubSchedule(t *testing.T) {
	for _, tc := range []struct {
		yaml  string
		every time.Duration
		rate  int64
	}{
		{"", 168 * time.Hour, 64 << 20},
		{"scrub: {}", 168 * time.Hour, 64 << 20},
		{"scrub: {every: 24h}", 24 * time.Hour, 64 << 20},
		{"scrub: {every: 0}", 0, 64 << 20},
		{"scrub: {rate: 0}", 168 * time.Hour, 0},
		{"scrub: {every: 12h30m, rate: 100MiB/s}", 12*time.Hour + 30*time.Minute, 100 << 20},
		{"scrub: {rate: 1GiB}", 168 * time.Hour, 1 << 30},
	} {
		t.Run(tc.yaml, func(t *testing.T) {
			c, err := Parse([]byte("exports:\n  - backend: file:///a\n    cache:\n      ssd: /ssd\n      "+tc.yaml+"\n"), "t.yaml")
			require.NoError(t, err)
			require.NoError(t, c.Validate(schemes))
			every, rate, err := c.Exports[0].Cache.Scrub.Schedule()
			require.NoError(t, err)
			require.Equal(t, tc.every, every)
			require.Equal(t, tc.rate, rate)
		})
	}
}

// One file may back several exports when every one of them only reads it.
func TestValidateOneFileReadOnlyExports(t *testing.T) {
	c := Defaults()
	c.Exports = []Export{{Name: "a", Backend: "file:///srv/nas.img", ReadOnly: true}, {Name: "b", Backend: "file:///srv/nas.img", ReadOnly: true}}
	require.NoError(t, c.Validate([]string{"file"}))
}

// FuzzParse: any config text gets a configuration or an error that names the file, never a
// panic (the node walk of decode.go, the syntax error's line search).
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"exports:\n  - name: a\n    backend: file:///x\n    cache: {ram: 1GiB}\n",
		"listen: unix:/run/x.sock\n",
		"exports:\n\t- name: a\n",
		"a: &x {b: 1}\nc: *x\n<<: *x\n",
		"exports: [{name: 'a, backend: x}]",
		"---\n...\n",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if _, err := Parse([]byte(s), "fuzz.yaml"); err != nil && !strings.Contains(err.Error(), "fuzz.yaml") {
			t.Fatalf("error without the file's name: %v", err)
		}
	})
}

// A ram refused for its units gets that error alone, not also the one of a cache without tiers.
func TestValidateRefusedRAMOneError(t *testing.T) {
	c := Defaults()
	c.Exports = []Export{{Name: "a", Backend: "mem://1GiB", Cache: &Cache{RAM: "64MB"}}}
	require.EqualError(t, c.Validate([]string{"mem"}),
		`exports[0].cache.ram: size "64MB": decimal units are not accepted (64MB would be 64000000 bytes); write 64MiB (67108864 bytes), or a number of bytes`)
}

// A config of two YAML documents is refused: the second's settings would be ignored.
func TestParseSecondDocument(t *testing.T) {
	_, err := Parse([]byte("log_level: debug\n---\nmax_in_flight: 8\n"), "two.yaml")
	require.EqualError(t, err, "config two.yaml:2: a second YAML document begins here (---); a config is one document: put its settings in the first")
	_, err = Parse([]byte("log_level: debug\n---\n"), "empty-second.yaml")
	require.NoError(t, err, "an empty second document holds no setting")
}
