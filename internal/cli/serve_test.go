//go:build linux

package cli

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/cache"
	"github.com/tierblk/tierblk/internal/config"
)

var testSchemes = []string{"file", "mem", "nbd", "nbd+unix"}

// serveArgs returns serveOpts as serve's flags make them from args.
func serveArgs(t *testing.T, args ...string) serveOpts {
	t.Helper()
	o := serveOpts{given: map[string][]string{}}
	fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	addServeFlags(fs, &o)
	require.NoError(t, fs.Parse(args))
	return o
}

func TestBuildConfig(t *testing.T) {
	dir := t.TempDir()
	cfgFile := filepath.Join(dir, "c.yaml")
	require.NoError(t, os.WriteFile(cfgFile, []byte(`
exports:
  - name: a
    backend: file:///srv/a.img
  - name: b
    backend: mem://2MiB
listen: [unix:/tmp/x.sock]
log_level: debug
`), 0o644))
	build := func(t *testing.T, args ...string) config.Config {
		t.Helper()
		c, _, err := buildConfig(serveArgs(t, args...), testSchemes, nil)
		require.NoError(t, err)
		return c
	}

	t.Run("flags alone", func(t *testing.T) {
		c := build(t, "--backend", "mem://1GiB", "--export", "d", "--nbd", "unix:/s")
		require.Equal(t, []config.Export{{Name: "d", Backend: "mem://1GiB"}}, c.Exports)
		require.Equal(t, []string{"unix:/s"}, c.Listen)
		require.Equal(t, "info", c.LogLevel)
		require.Equal(t, 64, c.MaxInFlight)
	})
	t.Run("no flags, the defaults", func(t *testing.T) {
		c, _, err := buildConfig(serveArgs(t), testSchemes, nil)
		require.ErrorContains(t, err, "no export")
		require.Equal(t, config.Defaults(), c)
	})
	t.Run("file alone", func(t *testing.T) {
		c := build(t, "--config", cfgFile)
		require.Len(t, c.Exports, 2)
		require.Equal(t, "debug", c.LogLevel)
	})
	t.Run("flags override the file", func(t *testing.T) {
		c := build(t, "--config", cfgFile, "--nbd", "127.0.0.1:1", "--nbd", "unix:/y.sock", "--read-only", "--log-level", "warn", "--max-in-flight", "8")
		require.Len(t, c.Exports, 2)
		require.True(t, c.Exports[0].ReadOnly && c.Exports[1].ReadOnly)
		require.Equal(t, []string{"127.0.0.1:1", "unix:/y.sock"}, c.Listen)
		require.Equal(t, "warn", c.LogLevel)
		require.Equal(t, 8, c.MaxInFlight)
	})
	t.Run("cache flags set the first export's cache", func(t *testing.T) {
		c := build(t, "--config", cfgFile, "--admin", "127.0.0.1:9810", "--ram", "64MiB", "--ssd", "/srv/ssd.img", "--ssd-size", "1GiB",
			"--line", "128KiB", "--mode", "writearound", "--policy", "s3fifo", "--admission", "nhit:2", "--meta", "/srv/meta", "--congestion", "off")
		require.Equal(t, &config.Cache{RAM: "64MiB", SSD: "/srv/ssd.img", SSDSize: "1GiB", Line: "128KiB", Mode: "writearound",
			Policy: "s3fifo", Admission: "nhit:2", Meta: "/srv/meta", Congestion: "off"}, c.Exports[0].Cache)
		require.Nil(t, c.Exports[1].Cache)
		require.Equal(t, "127.0.0.1:9810", c.Admin)
	})
	t.Run("dirty flags set the first export's write-back", func(t *testing.T) {
		c := build(t, "--backend", "file:///srv/a.img", "--ssd", "/srv/ssd.img", "--mode", "writeback", "--dirty-high", "0.6", "--dirty-low", "0.3", "--dirty-max", "0.8",
			"--write-back-order", "flush")
		require.Equal(t, config.WriteBack{High: config.Ratio(0.6), Low: config.Ratio(0.3), Max: config.Ratio(0.8), Order: cache.OrderFlush}, c.Exports[0].Cache.WriteBack)
		require.Equal(t, cache.OrderFlush, c.Exports[0].Cache.WriteBack.Engine().Order)
		require.Equal(t, "writeback", c.Exports[0].Cache.Mode)
	})
	t.Run("--dirty-low 0 is taken as given", func(t *testing.T) {
		c := build(t, "--backend", "file:///srv/a.img", "--ssd", "/srv/ssd.img", "--mode", "writeback", "--dirty-low", "0")
		wb := c.Exports[0].Cache.WriteBack.Engine()
		require.Equal(t, [3]float64{cache.DefaultWriteBack.High, 0, cache.DefaultWriteBack.Max}, [3]float64{wb.High, wb.Low, wb.Max})
	})
	t.Run("dirty flags override the file's write_back", func(t *testing.T) {
		f := filepath.Join(dir, "wb.yaml")
		require.NoError(t, os.WriteFile(f, []byte(`
exports:
  - backend: file:///srv/a.img
    cache: {ssd: /srv/ssd.img, mode: writeback, write_back: {high: 0.7, low: 0.2, max: 0.95, throttle: none}}
`), 0o644))
		c := build(t, "--config", f, "--dirty-max", "0.8")
		require.Equal(t, config.WriteBack{High: config.Ratio(0.7), Low: config.Ratio(0.2), Max: config.Ratio(0.8), Throttle: "none"}, c.Exports[0].Cache.WriteBack)
	})
	t.Run("device flags, no listener unless --nbd", func(t *testing.T) {
		c := build(t, "--backend", "mem://1GiB", "--ublk", "--ublk-id", "4", "--ublk-depth", "32", "--nbd-device", "/dev/nbd2")
		require.Empty(t, c.Listen)
		require.Equal(t, 4, c.Exports[0].UBLK.DeviceID())
		require.Equal(t, 32, c.Exports[0].UBLK.Depth)
		require.Equal(t, "/dev/nbd2", c.Exports[0].NBDDevice)
		c = build(t, "--backend", "mem://1GiB", "--ublk", "--nbd", "unix:/s")
		require.Equal(t, []string{"unix:/s"}, c.Listen)
		require.Equal(t, -1, c.Exports[0].UBLK.DeviceID())
		require.Empty(t, c.Exports[0].NBDDevice)
	})
	t.Run("a file's ublk device, tuned by a flag", func(t *testing.T) {
		f := filepath.Join(dir, "ublk.yaml")
		require.NoError(t, os.WriteFile(f, []byte("exports:\n  - backend: mem://1GiB\n    ublk: {queues: 2}\n"), 0o644))
		c := build(t, "--config", f, "--ublk-id", "3")
		require.Equal(t, config.UBLK{ID: &[]int{3}[0], Queues: 2}, *c.Exports[0].UBLK)
		require.Empty(t, c.Listen, "a file that serves a device opens no listener it does not name")
	})
	t.Run("who may connect", func(t *testing.T) {
		c := build(t, "--config", cfgFile, "--nbd", "unix:/s", "--nbd", "0.0.0.0:10809", "--allow", "10.0.0.0/8", "--allow", "192.168.1.7",
			"--socket-mode", "0660", "--socket-group", "disk")
		require.Equal(t, []string{"10.0.0.0/8", "192.168.1.7"}, c.Allow)
		require.Equal(t, "0660", c.SocketMode)
		require.Equal(t, "disk", c.SocketGroup)
	})
	t.Run("no cache flag, no cache", func(t *testing.T) {
		c := build(t, "--backend", "mem://1GiB")
		require.Nil(t, c.Exports[0].Cache)
	})
}

func TestBuildConfigErrorsNameTheFlag(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"nothing to serve", nil, "no export"},
		{"bad scheme", []string{"--backend", "tape:///dev/st0"}, `--backend: "tape:///dev/st0" has unknown scheme`},
		{"bad listen", []string{"--backend", "mem://1MiB", "--nbd", "nowhere"}, `--nbd: "nowhere" is neither`},
		{"bad level", []string{"--backend", "mem://1MiB", "--log-level", "chatty"}, "--log-level: "},
		{"bad max in flight", []string{"--backend", "mem://1MiB", "--max-in-flight", "0"}, "--max-in-flight: 0 is out of range"},
		{"export without backend", []string{"--export", "x"}, "--export names the export of --backend"},
		{"missing config file", []string{"--config", "/nonexistent/c.yaml"}, "/nonexistent/c.yaml"},
		{"bad mode", []string{"--backend", "mem://1MiB", "--ram", "1MiB", "--mode", "fast"}, "--mode: unknown cache mode"},
		{"bad ram", []string{"--backend", "mem://1MiB", "--ram", "1KiB"}, "--ram: "},
		{"bad line", []string{"--backend", "mem://1MiB", "--ram", "1MiB", "--line", "3KiB"}, "--line: "},
		{"ssd size alone", []string{"--backend", "mem://1MiB", "--ssd-size", "1GiB"}, "--ssd-size: "},
		{"bad policy", []string{"--backend", "mem://1MiB", "--ram", "1MiB", "--policy", "mru"}, "--policy: unknown eviction policy"},
		{"bad admission", []string{"--backend", "mem://1MiB", "--ram", "1MiB", "--admission", "maybe"}, "--admission: "},
		{"bad congestion", []string{"--backend", "file:///srv/a.img", "--ssd", "/srv/s.img", "--congestion", "soon"}, "--congestion: "},
		{"writeback without ssd", []string{"--backend", "mem://1MiB", "--ram", "1MiB", "--mode", "writeback"}, "--mode: writeback needs an SSD tier"},
		{"dirty max", []string{"--backend", "mem://1MiB", "--ram", "1MiB", "--dirty-max", "2"}, "--dirty-max: 2 is out of range"},
		{"dirty on stop", []string{"--backend", "mem://1MiB", "--ram", "1MiB", "--dirty-on-stop", "drop"}, `--dirty-on-stop: "drop": use keep`},
		{"write-back order", []string{"--backend", "mem://1MiB", "--ram", "1MiB", "--write-back-order", "fifo"}, `--write-back-order: "fifo": use address`},
		{"dirty low", []string{"--backend", "mem://1MiB", "--ram", "1MiB", "--dirty-low", "0.7"}, "--dirty-low: 0.7 must be below high"},
		{"dirty max 0", []string{"--backend", "mem://1MiB", "--ram", "1MiB", "--dirty-max", "0"}, "--dirty-max: 0 must be at least high"},
		{"dirty high", []string{"--backend", "mem://1MiB", "--ram", "1MiB", "--dirty-high", "0.95"}, "--dirty-high: 0.95 must be at most max"},
		{"ublk tuning without --ublk", []string{"--backend", "mem://1MiB", "--ublk-id", "1"}, "give --ublk too"},
		{"bad ublk depth", []string{"--backend", "mem://1MiB", "--ublk", "--ublk-depth", "9999"}, "--ublk-depth: 9999 is out of range"},
		{"ublk kept without an id", []string{"--backend", "mem://1MiB", "--ublk", "--ublk-on-stop", "keep"}, "--ublk-on-stop: keep needs a fixed device number"},
		{"bad nbd device", []string{"--backend", "mem://1MiB", "--nbd-device", "/dev/nbd"}, `--nbd-device: "/dev/nbd" is not a kernel NBD device`},
		{"public admin", []string{"--backend", "mem://1MiB", "--admin", "0.0.0.0:9000"}, "--admin: "},
		{"bad tls mode", []string{"--backend", "mem://1MiB", "--tls", "yes"}, `--tls: "yes" is not a TLS mode`},
		{"tls without certificates", []string{"--backend", "mem://1MiB", "--tls", "require"}, "--tls-certificates: missing; with --tls require"},
		{"verify peer without tls", []string{"--backend", "mem://1MiB", "--tls-verify-peer"}, "--tls-verify-peer: checks the certificates of TLS clients, and --tls is off: set --tls to on or require"},
		{"bad allow", []string{"--backend", "mem://1MiB", "--allow", "10.0.0.0/8", "--allow", "10.0.0.0/33"}, `--allow: "10.0.0.0/33" is not a network in CIDR notation`},
		{"allow without TCP", []string{"--backend", "mem://1MiB", "--nbd", "unix:/s", "--allow", "10.0.0.0/8"}, "--allow: is set but no listen address is HOST:PORT"},
		{"bad socket mode", []string{"--backend", "mem://1MiB", "--nbd", "unix:/s", "--socket-mode", "660rw"}, `--socket-mode: "660rw" is not permission bits`},
		{"socket group without a socket", []string{"--backend", "mem://1MiB", "--socket-group", "disk"}, "--socket-group: is set but no listen address is unix:/path"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := buildConfig(serveArgs(t, tc.args...), testSchemes, nil)
			require.ErrorContains(t, err, tc.want)
			require.Equal(t, 2, ExitCode(err))
		})
	}
}

// An SSD tier's file that does not exist, with no size to create it at, is a missing flag (or
// field), said before the backend is opened: its file, to be created, is not.
func TestServeSSDFileWithoutSize(t *testing.T) {
	dir := t.TempDir()
	backend := filepath.Join(dir, "backend.img")
	ssd := filepath.Join(dir, "ssd.img")
	cfgFile := filepath.Join(dir, "c.yaml")
	require.NoError(t, os.WriteFile(cfgFile, []byte("exports:\n  - backend: file://"+backend+"?size=1MiB\n    cache:\n      ssd: "+ssd+"\n"), 0o644))
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"flags", []string{"--backend", "file://" + backend + "?size=1MiB", "--ssd", ssd}, "--ssd: " + ssd + " does not exist; give its size (--ssd-size, ssd_size) to create it"},
		{"size 0", []string{"--backend", "file://" + backend + "?size=1MiB", "--ssd", ssd, "--ssd-size", "0"}, "--ssd: " + ssd + " does not exist; give its size (--ssd-size, ssd_size) to create it"},
		{"config file", []string{"--config", cfgFile}, "exports[0].cache.ssd: " + ssd + " does not exist; give its size (--ssd-size, ssd_size) to create it"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := serveArgs(t, tc.args...)
			o.stderr = io.Discard
			err := runServe(context.Background(), o)
			require.EqualError(t, err, tc.want)
			require.Equal(t, 2, ExitCode(err))
			require.NoFileExists(t, backend)
			require.NoFileExists(t, ssd)
		})
	}
}

// A flag's text that is not of its kind is refused as the command line is read, naming the flag.
func TestServeFlagKinds(t *testing.T) {
	for _, args := range [][]string{{"--dirty-high", "half"}, {"--max-in-flight", "many"}, {"--ublk-id", "1.5"}, {"--read-only=perhaps"}} {
		root := NewRoot("test")
		root.SetArgs(append([]string{"serve", "--backend", "mem://1MiB"}, args...))
		root.SetOut(io.Discard)
		root.SetErr(io.Discard)
		err := root.ExecuteContext(context.Background())
		require.ErrorContains(t, err, strings.SplitN(args[0], "=", 2)[0], args)
		require.Equal(t, 2, ExitCode(err), args)
	}
}

func TestExitCode(t *testing.T) {
	require.Equal(t, 0, ExitCode(nil))
	require.Equal(t, 1, ExitCode(errors.New("disk on fire")))
	require.Equal(t, 2, ExitCode(usageErrorf("bad flag")))
}

func TestRootFlagErrorsAreUsageErrors(t *testing.T) {
	root := NewRoot("test")
	root.SetArgs([]string{"serve", "--no-such-flag"})
	root.SetOut(&bytes.Buffer{})
	root.SetErr(&bytes.Buffer{})
	err := root.ExecuteContext(context.Background())
	require.ErrorContains(t, err, "--no-such-flag")
	require.Equal(t, 2, ExitCode(err))
}

func TestVersion(t *testing.T) {
	var out bytes.Buffer
	root := NewRoot("1.2.3")
	root.SetArgs([]string{"version"})
	root.SetOut(&out)
	require.NoError(t, root.Execute())
	require.Contains(t, out.String(), "tierblk 1.2.3 (go")
}
