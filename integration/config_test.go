package integration

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestConfigExports(t *testing.T) {
	requireTools(t, "nbdinfo")
	dir := shortTempDir(t)
	sock := filepath.Join(dir, "tierblk.sock")
	tcp := freeTCPAddr(t)
	cfg := filepath.Join(dir, "tierblk.yaml")
	require.NoError(t, os.WriteFile(cfg, []byte(fmt.Sprintf(`exports:
  - name: disk1
    backend: file://%s/a.img?size=16MiB
  - name: ram
    backend: mem://64MiB
    read_only: true
listen:
  - unix:%s
  - %s
log_level: info
`, dir, sock, tcp)), 0o644))
	d := startDaemon(t, tierblkPath, []string{"serve", "--config", cfg}, "unix:"+sock, tcp)
	d.Unix, d.TCP = sock, tcp

	exports := []struct {
		name  string
		size  int64
		flags exportFlags
	}{
		{"disk1", 16 << 20, writableFlags},
		{"ram", 64 << 20, readOnlyFlags},
		// The first export is also the default one, for clients that ask for no name.
		{"", 16 << 20, writableFlags},
	}
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			var names []string
			for _, e := range nbdInfo(t, tr.uri(d, ""), true) {
				names = append(names, e.Name)
			}
			require.ElementsMatch(t, []string{"disk1", "ram"}, names, "nbdinfo --list")
			for _, want := range exports {
				got := nbdInfo(t, tr.uri(d, want.name), false)
				require.Len(t, got, 1)
				require.Equal(t, want.size, got[0].Size, "size of export %q", want.name)
				require.Equal(t, want.flags, got[0].exportFlags, "flags of export %q", want.name)
			}
		})
	}
	// A name that is not configured is refused.
	out, err := runTool(t, "nbdinfo", unixURI(sock, "nosuch"))
	require.Error(t, err, "nbdinfo on an unknown export:\n%s", out)
}

// runTierblk runs the binary to completion and returns its exit status and output; it fails
// the test if the binary is still running after 20 seconds (a usage error must not serve).
func runTierblk(t *testing.T, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, tierblkPath, args...).CombinedOutput()
	require.NoError(t, ctx.Err(), "tierblk %s did not exit:\n%s", strings.Join(args, " "), out)
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return exit.ExitCode(), string(out)
	}
	require.NoError(t, err)
	return 0, string(out)
}

func TestVersion(t *testing.T) {
	code, out := runTierblk(t, "version")
	require.Zero(t, code, out)
	require.NotEmpty(t, strings.TrimSpace(out))
}

func TestBadInput(t *testing.T) {
	dir := shortTempDir(t)
	existing := filepath.Join(dir, "existing.img")
	want := randomFile(t, existing, 1<<20)
	missing := filepath.Join(dir, "missing.img")
	sock := "unix:" + filepath.Join(dir, "tierblk.sock")
	writeConfig := func(name, body string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(body), 0o644))
		return p
	}
	unknownField := writeConfig("unknown.yaml", "exports:\n  - name: a\n    backend: file://"+existing+"\n    bakend: x\n")
	badValue := writeConfig("badvalue.yaml", "exports:\n  - name: a\n    backend: file://"+existing+"\n    read_only: maybe\n")
	noListen := writeConfig("nolisten.yaml", "exports:\n  - name: a\n    backend: file://"+existing+"\nlisten: []\n")

	tests := []struct {
		name string
		args []string
		code int
		// msg are substrings the error must contain: the flag or field, and the bad value.
		msg []string
	}{
		{"unknown flag", []string{"serve", "--backend", "file://" + existing, "--nbd", sock, "--bogus"}, 2, []string{"bogus"}},
		{"unknown command", []string{"servee"}, 2, []string{"servee"}},
		{"no backend", []string{"serve", "--nbd", sock}, 2, []string{"--backend"}},
		{"unknown scheme", []string{"serve", "--backend", "ftp://host/disk", "--nbd", sock}, 2, []string{"--backend", "ftp"}},
		{"bad listen address", []string{"serve", "--backend", "file://" + existing, "--nbd", "nowhere"}, 2, []string{"--nbd", "nowhere"}},
		{"missing file without size", []string{"serve", "--backend", "file://" + missing, "--nbd", sock}, 2, []string{"--backend", "size"}},
		{"bad file size", []string{"serve", "--backend", "file://" + missing + "?size=12XB", "--nbd", sock}, 2, []string{"--backend", "12XB"}},
		{"bad mem size", []string{"serve", "--backend", "mem://lots", "--nbd", sock}, 2, []string{"--backend", "lots"}},
		{"bad log level", []string{"serve", "--backend", "file://" + existing, "--nbd", sock, "--log-level", "loud"}, 2, []string{"log-level", "loud"}},
		{"unknown config field", []string{"serve", "--config", unknownField}, 2, []string{"bakend"}},
		{"bad config value", []string{"serve", "--config", badValue}, 2, []string{"maybe"}},
		{"config without listen", []string{"serve", "--config", noListen}, 2, []string{"listen"}},
		{"config file missing", []string{"serve", "--config", filepath.Join(dir, "nosuch.yaml")}, 2, []string{"nosuch.yaml"}},
		// Runtime failures, not usage: the input is well formed but the thing it names is unusable.
		{"backend is a directory", []string{"serve", "--backend", "file://" + dir, "--nbd", sock}, 1, []string{dir}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out := runTierblk(t, tt.args...)
			require.Equal(t, tt.code, code, "exit status of tierblk %s:\n%s", strings.Join(tt.args, " "), out)
			for _, m := range tt.msg {
				require.Contains(t, out, m)
			}
			require.NotContains(t, out, "goroutine", "a usage error must not be a crash")
			require.Equal(t, want, fileSHA256(t, existing), "the existing backing file changed")
			require.NoFileExists(t, missing, "a failed start created the backing file")
		})
	}
}
