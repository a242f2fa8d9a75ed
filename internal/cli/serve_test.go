package cli

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

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
    backend: mem://1MiB
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
