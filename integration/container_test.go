package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/metrics"
)

func init() {
	toolPackages["podman"] = "podman"
	toolPackages["runc"] = "runc"
}

// imageUser is the user the image runs as (Containerfile's USER): the state and socket
// directories a test mounts must be writable by it.
const imageUser = 65532

// podman runs podman commands for a test with the machine's quirks handled in the test's own
// containers.conf (CONTAINERS_CONF), never in the machine's: this machine's hybrid cgroups and
// rlimits refuse the runtime's default ulimits, and only Debian's runc (not crun) runs containers
// here.
type podman struct {
	t    *testing.T
	conf string
}

func newPodman(t *testing.T, dir string) *podman {
	t.Helper()
	requireTools(t, "podman", "runc")
	conf := filepath.Join(dir, "containers.conf")
	require.NoError(t, os.WriteFile(conf, []byte("[containers]\ndefault_ulimits = []\n"), 0o644))
	return &podman{t: t, conf: conf}
}

// buildImage runs `make TARGET` with the image named image (its variable imageVar) and the build in
// tmp, removes the image when the test ends, and returns its reference, image:VERSION, and the version.
func (p *podman) buildImage(t *testing.T, tmp, target, imageVar, contextVar, image string) (ref, version string) {
	t.Helper()
	version = strings.TrimSpace(mustGit(t, "describe", "--tags", "--always", "--dirty"))
	t.Cleanup(func() { _, _ = p.try("rmi", "--force", image+":"+version, image+":latest") })
	start := time.Now()
	build := exec.Command("make", "-s", target, imageVar+"="+image, "BIN="+filepath.Join(tmp, "tierblk"),
		contextVar+"="+filepath.Join(tmp, "context"))
	build.Dir = ".."
	build.Env = p.env()
	out, err := build.CombinedOutput()
	require.NoError(t, err, "make %s:\n%s", target, out)
	t.Logf("make %s: %v", target, time.Since(start).Round(100*time.Millisecond))
	return image + ":" + version, version
}

func (p *podman) env() []string { return append(os.Environ(), "CONTAINERS_CONF="+p.conf) }

// run runs podman with args and returns its output, failing the test when it fails.
func (p *podman) run(args ...string) string {
	p.t.Helper()
	out, err := p.try(args...)
	require.NoError(p.t, err, "podman %s:\n%s", strings.Join(args, " "), out)
	return out
}

func (p *podman) try(args ...string) (string, error) {
	cmd := exec.Command("podman", args...)
	cmd.Env = p.env()
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// containerRun is `podman run`'s options that every container of the tests takes: Debian's runc and
// no network (the NBD and admin endpoints are unix sockets in a mounted directory).
var containerRun = []string{"run", "--runtime", "/usr/sbin/runc", "--network", "none"}

// TestContainerImage builds the image with `make image` and runs it as its users would: a mounted
// config, a state directory and a socket directory shared with the host. From the host, nbdinfo
// and fio (verifying crc32c) go through the container's NBD socket and `tierblk stats` through its
// admin socket; `tierblk version` in the image prints the version and its label the commit. The
// cache is in write-back with on_stop: flush, so after `podman stop` (SIGTERM) the backing file in
// the mounted volume must hold every write: it equals, byte for byte, what the container served
// before the stop, and fio's verify of the same job reads it back from the file itself.
func TestContainerImage(t *testing.T) {
	requireTools(t, "make", "nbdinfo", "nbdcopy", "fio")
	tmp := shortTempDir(t)
	p := newPodman(t, tmp)

	commit := strings.TrimSpace(mustGit(t, "rev-parse", "HEAD"))
	image := fmt.Sprintf("localhost/tierblk-test-%d", os.Getpid())
	ref, version := p.buildImage(t, tmp, "image", "IMAGE", "IMAGE_CONTEXT", image)

	require.Equal(t, fmt.Sprintf("%d:%d", imageUser, imageUser),
		strings.TrimSpace(p.run("image", "inspect", "--format", "{{.Config.User}}", ref)), "the image's user")
	require.Equal(t, commit, strings.TrimSpace(p.run("image", "inspect", "--format",
		`{{index .Labels "org.opencontainers.image.revision"}}`, ref)), "the image's revision label")
	vers := p.run(append(append([]string{}, containerRun...), "--rm", ref, "version")...)
	require.Contains(t, vers, "tierblk "+version+" ", "tierblk version in the image")

	// The state and socket directories, as a user would give them: writable by the image's user.
	state, run := filepath.Join(tmp, "state"), filepath.Join(tmp, "run")
	for _, dir := range []string{state, run} {
		require.NoError(t, os.Mkdir(dir, 0o755))
		require.NoError(t, os.Chown(dir, imageUser, imageUser))
	}
	config := filepath.Join(tmp, "tierblk.yaml")
	require.NoError(t, os.WriteFile(config, []byte(`exports:
  - name: disk
    backend: file:///var/lib/tierblk/backing.img?size=64MiB
    cache:
      mode: writeback
      ssd: /var/lib/tierblk/ssd.img
      ssd_size: 64MiB
      write_back:
        on_stop: flush
listen: [unix:/run/tierblk/tierblk.sock]
admin: unix:/run/tierblk/admin.sock
`), 0o644))
	name := filepath.Base(image)
	t.Cleanup(func() {
		if t.Failed() {
			logs, _ := p.try("logs", name)
			t.Logf("container %s's log:\n%s", name, logs)
		}
		_, _ = p.try("rm", "--force", name)
	})
	p.run(append(append([]string{}, containerRun...), "--detach", "--name", name,
		"-v", state+":/var/lib/tierblk", "-v", run+":/run/tierblk",
		"-v", config+":/etc/tierblk/tierblk.yaml:ro", ref)...)
	sock, admin := filepath.Join(run, "tierblk.sock"), filepath.Join(run, "admin.sock")
	waitSocket(t, sock)
	waitSocket(t, admin)
	uri := unixURI(sock, "")

	info := mustRunTool(t, "nbdinfo", uri)
	require.Contains(t, info, "export-size: 67108864", "nbdinfo through the container's socket")

	// One fio job, run through the container and later against the backing file: the same
	// options (and fio's fixed random seed) write and then verify the same blocks.
	job := []string{"--name=container", "--rw=randwrite", "--bs=4k", "--size=16m", "--iodepth=16",
		"--verify=crc32c", "--verify_fatal=1"}
	fio := mustRunTool(t, "fio", append(job, "--ioengine=nbd", "--uri="+uri)...)
	require.Contains(t, fio, "err= 0", "fio through the container's socket")

	statsOut := mustRunTool(t, tierblkPath, "stats", "--admin", "unix:"+admin, "--json")
	var stats metrics.StatsResponse
	require.NoError(t, json.Unmarshal([]byte(statsOut), &stats), "%s", statsOut)
	require.Len(t, stats.Exports, 1)
	s := stats.Exports[0].Stats
	require.Equal(t, "writeback", s.Mode)
	require.Len(t, s.Tiers, 1)
	require.NotZero(t, s.Tiers[0].Lines, "tierblk stats: fio's writes on the SSD tier")
	t.Logf("before the stop: %d dirty bytes on the SSD tier", s.Dirty.Bytes)
	require.Contains(t, mustRunTool(t, tierblkPath, "stats", "--admin", "unix:"+admin), "export disk: mode writeback")

	// What the container serves now; after the stop the backing file must hold the same.
	served := filepath.Join(tmp, "served.img")
	mustRunTool(t, "nbdcopy", uri, served)

	start := time.Now()
	p.run("stop", "--time", "60", name)
	t.Logf("podman stop: %v", time.Since(start).Round(100*time.Millisecond))
	require.Equal(t, "0", strings.TrimSpace(p.run("inspect", "--format", "{{.State.ExitCode}}", name)),
		"tierblk's exit status after SIGTERM")
	logs := p.run("logs", name)
	require.Contains(t, logs, "stopping: dirty data written back")
	require.Contains(t, logs, "stopped cleanly")

	backing := filepath.Join(state, "backing.img")
	fi, err := os.Stat(backing)
	require.NoError(t, err)
	require.Equal(t, uint32(imageUser), fi.Sys().(*syscall.Stat_t).Uid, "the backing file's owner: the container ran as its user")
	want, err := os.ReadFile(served)
	require.NoError(t, err)
	got, err := os.ReadFile(backing)
	require.NoError(t, err)
	require.True(t, bytes.Equal(want, got), "the backing file differs from what the container served before the stop: dirty data was left behind")
	verify := mustRunTool(t, "fio", append(job, "--ioengine=psync", "--filename="+backing, "--verify_only")...)
	require.Contains(t, verify, "err= 0", "fio's verify of the backing file")
}

// waitSocket waits until a unix socket accepts a connection.
func waitSocket(t *testing.T, path string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.DialTimeout("unix", path, time.Second)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("nothing accepts connections on %s: %v", path, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// mustGit runs git in the repository and returns its output.
func mustGit(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = ".."
	out, err := cmd.Output()
	require.NoError(t, err, "git %s", strings.Join(args, " "))
	return string(out)
}
