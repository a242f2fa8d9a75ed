package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"
)

func init() { toolPackages["podman-compose"] = "podman-compose" }

// composeFile is the part of the compose specification that configs/compose.yaml relies on, in
// the forms both podman-compose and Docker compose read (lists, not maps, where either is allowed).
type composeFile struct {
	Services map[string]composeService `yaml:"services"`
	Volumes  map[string]any            `yaml:"volumes"`
}

type composeService struct {
	Image           string   `yaml:"image"`
	User            string   `yaml:"user"`
	Privileged      bool     `yaml:"privileged"`
	Command         []string `yaml:"command"`
	Environment     []string `yaml:"environment"`
	Volumes         []string `yaml:"volumes"`
	Devices         []string `yaml:"devices"`
	DependsOn       []string `yaml:"depends_on"`
	StopSignal      string   `yaml:"stop_signal"`
	StopGracePeriod string   `yaml:"stop_grace_period"`
}

// flagValue returns the value that follows flag in a command, or "" when flag is absent.
func flagValue(cmd []string, flag string) string {
	if i := slices.Index(cmd, flag); i >= 0 && i+1 < len(cmd) {
		return cmd[i+1]
	}
	return ""
}

// TestComposeFile reads configs/compose.yaml as compose would: the fields it relies on parse, and
// so does the commented ublk variant once uncommented; podman-compose turns the file into podman
// commands (--dry-run) with every variable filled in; and the tierblk service's command, with the
// placeholder backend and the container's paths replaced, serves and stops cleanly on this host.
func TestComposeFile(t *testing.T) {
	requireTools(t, "podman-compose", "nbdinfo")
	raw, err := os.ReadFile("../configs/compose.yaml")
	require.NoError(t, err)
	var f composeFile
	require.NoError(t, yaml.Unmarshal(raw, &f))

	tb, ok := f.Services["tierblk"]
	require.True(t, ok, "a service named tierblk")
	require.Equal(t, "localhost/tierblk:latest", tb.Image, "the image make image builds")
	require.Equal(t, "serve", tb.Command[0])
	require.Contains(t, flagValue(tb.Command, "--backend"), "nbd://", "the NAS placeholder")
	require.Equal(t, "unix:/run/tierblk/tierblk.sock", flagValue(tb.Command, "--nbd"))
	require.Equal(t, "unix:/run/tierblk/admin.sock", flagValue(tb.Command, "--admin"))
	require.Equal(t, "writeback", flagValue(tb.Command, "--mode"))
	require.Equal(t, "flush", flagValue(tb.Command, "--dirty-on-stop"))
	require.True(t, strings.HasPrefix(flagValue(tb.Command, "--ssd"), "/var/cache/tierblk/"), "the SSD tier in the cache directory volume")
	require.Contains(t, tb.Volumes, "tierblk-run:/run/tierblk")
	require.True(t, slices.ContainsFunc(tb.Volumes, func(v string) bool { return strings.HasSuffix(v, ":/var/cache/tierblk") }),
		"a cache directory volume: %q", tb.Volumes)
	require.Equal(t, "SIGTERM", tb.StopSignal)
	require.NotEmpty(t, tb.StopGracePeriod)
	require.Contains(t, f.Volumes, "tierblk-run")

	fio, ok := f.Services["fio"]
	require.True(t, ok, "a client service named fio")
	require.Contains(t, fio.Volumes, "tierblk-run:/run/tierblk")
	require.Contains(t, fio.DependsOn, "tierblk")
	require.Contains(t, strings.Join(fio.Command, " "), "nbd+unix:///?socket=/run/tierblk/tierblk.sock")

	// The ublk variant is commented out (it needs privileges and a kernel module): uncommented,
	// it must still be valid and say what it needs.
	var variant []string
	in := false
	for _, line := range strings.Split(string(raw), "\n") {
		switch {
		case line == "  # tierblk-ublk:":
			in = true
		case in && !strings.HasPrefix(line, "  #"):
			in = false
		}
		if in {
			variant = append(variant, strings.TrimPrefix(strings.TrimPrefix(line, "  #"), " "))
		}
	}
	require.NotEmpty(t, variant, "the commented tierblk-ublk service")
	var uf map[string]composeService
	require.NoError(t, yaml.Unmarshal([]byte(strings.Join(variant, "\n")), &uf), "the ublk variant, uncommented:\n%s", strings.Join(variant, "\n"))
	ub := uf["tierblk-ublk"]
	require.True(t, ub.Privileged, "ublk needs privileges")
	require.Equal(t, "0:0", ub.User, "ublk needs root in the container")
	require.Contains(t, ub.Command, "--ublk")
	require.Contains(t, ub.Volumes, "/dev:/dev", "the device nodes tierblk makes appear in the container")
	require.Contains(t, uf["app"].Devices, "/dev/ublkb0:/dev/ublkb0")

	// --dry-run prints the podman commands; it still creates the project's volume and network,
	// which a project name of the test's own keeps apart and the cleanup removes.
	tmp := shortTempDir(t)
	p := newPodman(t, tmp)
	project := fmt.Sprintf("tbcompose%d", os.Getpid())
	t.Cleanup(func() {
		_, _ = p.try("volume", "rm", "--force", project+"_tierblk-run")
		_, _ = p.try("network", "rm", "--force", project+"_default")
	})
	out := p.runCompose("-p", project, "-f", "../configs/compose.yaml", "--dry-run", "up", "-d")
	var runs []string
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "podman run ") {
			runs = append(runs, line)
		}
	}
	require.Len(t, runs, 2, "podman-compose's podman run commands:\n%s", out)
	require.NotContains(t, strings.Join(runs, "\n"), "${", "a variable podman-compose left unfilled")
	require.Contains(t, runs[0], "--stop-signal SIGTERM")
	require.Contains(t, runs[0], "-e TIERBLK_ISCSI_USER ")
	require.Contains(t, runs[0], "-v /srv/ssd/tierblk:/var/cache/tierblk")
	require.Contains(t, runs[0], "localhost/tierblk:latest serve --backend nbd://nas.example:10809/export ")

	// The service's command on this host: a file for the NAS, temporary directories for the volumes.
	cache, run := filepath.Join(tmp, "cache"), filepath.Join(tmp, "run")
	require.NoError(t, os.Mkdir(cache, 0o755))
	require.NoError(t, os.Mkdir(run, 0o755))
	args := make([]string, 0, len(tb.Command))
	for _, a := range tb.Command[1:] {
		a = os.Expand(a, func(v string) string {
			name, def, _ := strings.Cut(v, ":-")
			switch name {
			case "TIERBLK_BACKEND":
				return "file://" + filepath.Join(tmp, "nas.img") + "?size=64MiB"
			case "TIERBLK_SSD_SIZE":
				return "32MiB"
			}
			return def
		})
		a = strings.ReplaceAll(a, "/var/cache/tierblk", cache)
		args = append(args, strings.ReplaceAll(a, "/run/tierblk", run))
	}
	sock := filepath.Join(run, "tierblk.sock")
	d := startDaemon(t, tierblkPath, append([]string{"serve"}, args...), "unix:"+sock, "unix:"+filepath.Join(run, "admin.sock"))
	require.Contains(t, mustRunTool(t, "nbdinfo", unixURI(sock, "")), "export-size: 67108864")
	fi, err := os.Stat(sock)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o666), fi.Mode().Perm(), "the NBD socket's mode: open to clients of any user")
	d.requireStop(syscall.SIGTERM)
}

// runCompose runs podman-compose with the test's containers.conf and returns its output.
func (p *podman) runCompose(args ...string) string {
	p.t.Helper()
	cmd := exec.Command("podman-compose", args...)
	cmd.Env = p.env()
	out, err := cmd.CombinedOutput()
	require.NoError(p.t, err, "podman-compose %s:\n%s", strings.Join(args, " "), out)
	return string(out)
}
