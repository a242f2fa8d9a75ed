//go:build linux

package cli

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/cache"
	"github.com/tierblk/tierblk/internal/config"
)

var testSchemes = []string{"file", "mem", "nbd", "nbd+unix"}

// optsWith returns serveOpts as if the given flags had been typed.
func optsWith(o serveOpts, set ...string) serveOpts {
	o.set = func(name string) bool {
		for _, s := range set {
			if s == name {
				return true
			}
		}
		return false
	}
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

	t.Run("flags alone", func(t *testing.T) {
		c, err := buildConfig(optsWith(serveOpts{backend: "mem://1GiB", export: "d", nbd: []string{"unix:/s"}}, "backend", "export", "nbd"), testSchemes)
		require.NoError(t, err)
		require.Equal(t, []config.Export{{Name: "d", Backend: "mem://1GiB"}}, c.Exports)
		require.Equal(t, []string{"unix:/s"}, c.Listen)
		require.Equal(t, "info", c.LogLevel)
	})
	t.Run("file alone", func(t *testing.T) {
		c, err := buildConfig(optsWith(serveOpts{configFile: cfgFile}), testSchemes)
		require.NoError(t, err)
		require.Len(t, c.Exports, 2)
		require.Equal(t, "debug", c.LogLevel)
	})
	t.Run("flags override the file", func(t *testing.T) {
		c, err := buildConfig(optsWith(serveOpts{configFile: cfgFile, nbd: []string{"127.0.0.1:1"}, readOnly: true, logLevel: "warn"},
			"nbd", "read-only", "log-level"), testSchemes)
		require.NoError(t, err)
		require.Len(t, c.Exports, 2)
		require.True(t, c.Exports[0].ReadOnly && c.Exports[1].ReadOnly)
		require.Equal(t, []string{"127.0.0.1:1"}, c.Listen)
		require.Equal(t, "warn", c.LogLevel)
	})
	t.Run("cache flags set the first export's cache", func(t *testing.T) {
		o := serveOpts{configFile: cfgFile, admin: "127.0.0.1:9810",
			cache: config.Cache{RAM: "64MiB", SSD: "/srv/ssd.img", SSDSize: "1GiB", Line: "128KiB", Mode: "writearound",
				Policy: "s3fifo", Admission: "nhit:2", Meta: "/srv/meta"}}
		c, err := buildConfig(optsWith(o, "ram", "ssd", "ssd-size", "line", "mode", "policy", "admission", "meta", "admin"), testSchemes)
		require.NoError(t, err)
		require.Equal(t, &o.cache, c.Exports[0].Cache)
		require.Nil(t, c.Exports[1].Cache)
		require.Equal(t, "127.0.0.1:9810", c.Admin)
	})
	t.Run("dirty flags set the first export's write-back", func(t *testing.T) {
		o := serveOpts{backend: "file:///srv/a.img", cache: config.Cache{SSD: "/srv/ssd.img", Mode: "writeback",
			WriteBack: config.WriteBack{High: config.Ratio(0.6), Low: config.Ratio(0.3), Max: config.Ratio(0.8)}}}
		c, err := buildConfig(optsWith(o, "backend", "ssd", "mode", "dirty-high", "dirty-low", "dirty-max"), testSchemes)
		require.NoError(t, err)
		require.Equal(t, config.WriteBack{High: config.Ratio(0.6), Low: config.Ratio(0.3), Max: config.Ratio(0.8)}, c.Exports[0].Cache.WriteBack)
		require.Equal(t, "writeback", c.Exports[0].Cache.Mode)
	})
	t.Run("--dirty-low 0 is taken as given", func(t *testing.T) {
		o := serveOpts{backend: "file:///srv/a.img", cache: config.Cache{SSD: "/srv/ssd.img", Mode: "writeback",
			WriteBack: config.WriteBack{Low: config.Ratio(0)}}}
		c, err := buildConfig(optsWith(o, "backend", "ssd", "mode", "dirty-low"), testSchemes)
		require.NoError(t, err)
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
		o := serveOpts{configFile: f, cache: config.Cache{WriteBack: config.WriteBack{Max: config.Ratio(0.8)}}}
		c, err := buildConfig(optsWith(o, "dirty-max"), testSchemes)
		require.NoError(t, err)
		require.Equal(t, config.WriteBack{High: config.Ratio(0.7), Low: config.Ratio(0.2), Max: config.Ratio(0.8), Throttle: "none"}, c.Exports[0].Cache.WriteBack)
	})
	t.Run("device flags, no listener unless --nbd", func(t *testing.T) {
		o := serveOpts{backend: "mem://1GiB", ublk: true, ublkID: 4, nbdDevice: "/dev/nbd2"}
		c, err := buildConfig(optsWith(o, "backend", "ublk", "ublk-id", "nbd-device"), testSchemes)
		require.NoError(t, err)
		require.Empty(t, c.Listen)
		require.Equal(t, 4, c.Exports[0].UBLK.DeviceID())
		require.Equal(t, "/dev/nbd2", c.Exports[0].NBDDevice)
		o.nbd = []string{"unix:/s"}
		c, err = buildConfig(optsWith(o, "backend", "ublk", "nbd"), testSchemes)
		require.NoError(t, err)
		require.Equal(t, []string{"unix:/s"}, c.Listen)
		require.Equal(t, -1, c.Exports[0].UBLK.DeviceID())
		require.Empty(t, c.Exports[0].NBDDevice)
	})
	t.Run("no cache flag, no cache", func(t *testing.T) {
		c, err := buildConfig(optsWith(serveOpts{backend: "mem://1GiB", cache: config.Cache{RAM: "1GiB"}}, "backend"), testSchemes)
		require.NoError(t, err)
		require.Nil(t, c.Exports[0].Cache)
	})
}

func TestBuildConfigErrorsNameTheFlag(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    serveOpts
		want string
	}{
		{"nothing to serve", optsWith(serveOpts{}), "no export"},
		{"bad scheme", optsWith(serveOpts{backend: "iscsi://nas/lun"}, "backend"), `--backend: "iscsi://nas/lun" has unknown scheme`},
		{"bad listen", optsWith(serveOpts{backend: "mem://1MiB", nbd: []string{"nowhere"}}, "backend", "nbd"), "--nbd"},
		{"bad level", optsWith(serveOpts{backend: "mem://1MiB", logLevel: "chatty"}, "backend", "log-level"), "--log-level"},
		{"export without backend", optsWith(serveOpts{export: "x"}, "export"), "--export"},
		{"missing config file", optsWith(serveOpts{configFile: "/nonexistent/c.yaml"}), "/nonexistent/c.yaml"},
		{"bad mode", optsWith(serveOpts{backend: "mem://1MiB", cache: config.Cache{RAM: "1MiB", Mode: "fast"}}, "backend", "ram", "mode"), "--mode: unknown cache mode"},
		{"bad ram", optsWith(serveOpts{backend: "mem://1MiB", cache: config.Cache{RAM: "1KiB"}}, "backend", "ram"), "--ram: "},
		{"bad line", optsWith(serveOpts{backend: "mem://1MiB", cache: config.Cache{RAM: "1MiB", Line: "3KiB"}}, "backend", "ram", "line"), "--line: "},
		{"ssd size alone", optsWith(serveOpts{backend: "mem://1MiB", cache: config.Cache{SSDSize: "1GiB"}}, "backend", "ssd-size"), "--ssd-size: "},
		{"bad policy", optsWith(serveOpts{backend: "mem://1MiB", cache: config.Cache{RAM: "1MiB", Policy: "mru"}}, "backend", "ram", "policy"), "--policy: unknown eviction policy"},
		{"bad admission", optsWith(serveOpts{backend: "mem://1MiB", cache: config.Cache{RAM: "1MiB", Admission: "maybe"}}, "backend", "ram", "admission"), "--admission: "},
		{"writeback without ssd", optsWith(serveOpts{backend: "mem://1MiB", cache: config.Cache{RAM: "1MiB", Mode: "writeback"}}, "backend", "ram", "mode"), "--mode: writeback needs an SSD tier"},
		{"dirty max", optsWith(serveOpts{backend: "mem://1MiB", cache: config.Cache{RAM: "1MiB", WriteBack: config.WriteBack{Max: config.Ratio(2)}}}, "backend", "ram", "dirty-max"), "--dirty-max: 2 is out of range"},
		{"dirty low", optsWith(serveOpts{backend: "mem://1MiB", cache: config.Cache{RAM: "1MiB", WriteBack: config.WriteBack{Low: config.Ratio(0.7)}}}, "backend", "ram", "dirty-low"), "--dirty-low: 0.7 must be below high"},
		{"dirty max 0", optsWith(serveOpts{backend: "mem://1MiB", cache: config.Cache{RAM: "1MiB", WriteBack: config.WriteBack{Max: config.Ratio(0)}}}, "backend", "ram", "dirty-max"), "--dirty-max: 0 must be at least high"},
		{"dirty high", optsWith(serveOpts{backend: "mem://1MiB", cache: config.Cache{RAM: "1MiB", WriteBack: config.WriteBack{High: config.Ratio(0.95)}}}, "backend", "ram", "dirty-high"), "--dirty-high: 0.95 must be at most max"},
		{"ublk tuning without --ublk", optsWith(serveOpts{backend: "mem://1MiB", ublkID: 1}, "backend", "ublk-id"), "give --ublk too"},
		{"bad ublk depth", optsWith(serveOpts{backend: "mem://1MiB", ublk: true, ublkConf: config.UBLK{Depth: 9999}}, "backend", "ublk", "ublk-depth"), "--ublk-depth: 9999 is out of range"},
		{"bad nbd device", optsWith(serveOpts{backend: "mem://1MiB", nbdDevice: "/dev/nbd"}, "backend", "nbd-device"), `--nbd-device: "/dev/nbd" is not a kernel NBD device`},
		{"public admin", optsWith(serveOpts{backend: "mem://1MiB", admin: "0.0.0.0:9000"}, "backend", "admin"), "--admin: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := buildConfig(tc.o, testSchemes)
			require.ErrorContains(t, err, tc.want)
			require.Equal(t, 2, ExitCode(err))
		})
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
