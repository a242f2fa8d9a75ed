//go:build linux

package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestMain runs main, not the tests, when a test starts this binary as tierblk (asTierblk): the
// tests run the command as a user types it, with main's exit status and output.
func TestMain(m *testing.M) {
	if os.Getenv("TIERBLK_TEST_AS_MAIN") == "1" {
		main()
		return
	}
	os.Exit(m.Run())
}

// asTierblk runs this test binary as `tierblk args...` and returns its exit status, stdout and stderr.
func asTierblk(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "TIERBLK_TEST_AS_MAIN=1")
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return exit.ExitCode(), out.String(), errOut.String()
	}
	require.NoError(t, err)
	return 0, out.String(), errOut.String()
}

// Mistakes in what was typed exit 2, failures at run time 1; the first line of stderr says which
// mistake or failure.
func TestExitStatus(t *testing.T) {
	dir := t.TempDir()
	existing := filepath.Join(dir, "existing.img")
	require.NoError(t, os.WriteFile(existing, make([]byte, 1<<20), 0o644))
	existingSSD := filepath.Join(dir, "existing-ssd.img")
	require.NoError(t, os.WriteFile(existingSSD, make([]byte, 1<<20), 0o644))
	missing := filepath.Join(dir, "missing.img")
	ssd := filepath.Join(dir, "ssd.img")
	sock := "unix:" + filepath.Join(dir, "nbd.sock")
	for _, tc := range []struct {
		name  string
		args  []string
		code  int
		first string // the first line of stderr
	}{
		{"mistyped command before a flag", []string{"statss", "--admin", "x"}, 2,
			`tierblk: unknown command "statss" for "tierblk"; did you mean stats? (see 'tierblk --help')`},
		{"mistyped command", []string{"sats"}, 2,
			`tierblk: unknown command "sats" for "tierblk"; did you mean stats? (see 'tierblk --help')`},
		{"help on a mistyped command", []string{"help", "statss"}, 2,
			`tierblk: unknown command "statss" for "tierblk"; did you mean stats? (see 'tierblk --help')`},
		{"unknown command", []string{"frobnicate"}, 2,
			`tierblk: unknown command "frobnicate" for "tierblk" (see 'tierblk --help')`},
		{"mistyped benchmark before a flag", []string{"bench", "nbdd", "--work", "x"}, 2,
			`tierblk: unknown benchmark "nbdd"; did you mean nbd? (use 'tierblk bench nbd', 'tierblk bench cache', 'tierblk bench writeback', 'tierblk bench sim', 'tierblk bench startup', 'tierblk bench cold', 'tierblk bench memory', 'tierblk bench kernel' or 'tierblk bench replica')`},
		{"unknown flag", []string{"--bogus"}, 2, `tierblk: unknown flag: --bogus (see 'tierblk --help')`},
		{"unknown flag of a command", []string{"stats", "--bogus"}, 2, `tierblk: unknown flag: --bogus (see 'tierblk stats --help')`},
		{"argument to a command without any", []string{"stats", "x"}, 2,
			`tierblk: "tierblk stats" takes no arguments, only flags, and was given "x" (see 'tierblk stats --help')`},
		{"argument to version", []string{"version", "x"}, 2,
			`tierblk: "tierblk version" takes no arguments, only flags, and was given "x" (see 'tierblk version --help')`},
		{"missing flag", []string{"stats"}, 2,
			"tierblk: --admin is required: the daemon's admin endpoint, unix:/path/to.sock or 127.0.0.1:PORT"},
		{"bad flag value", []string{"stats", "--admin", "nowhere"}, 2,
			`tierblk: --admin: admin address "nowhere" is neither unix:/path/to.sock nor HOST:PORT`},
		{"ssd file without --ssd-size", []string{"serve", "--backend", "file://" + existing, "--nbd", sock, "--ssd", ssd}, 2,
			"tierblk: --ssd: " + ssd + " does not exist; give its size (--ssd-size, ssd_size) to create it"},
		{"backend file without ?size=", []string{"serve", "--backend", "file://" + missing, "--nbd", sock}, 2,
			"tierblk: --backend: backend file://" + missing + ": " + missing + " does not exist; add ?size=SIZE to create it (for example file://" + missing + "?size=1GiB)"},
		{"group that does not exist", []string{"serve", "--backend", "file://" + existing, "--nbd", sock, "--socket-group", "no-such-group-here"}, 2,
			`tierblk: --socket-group: no group "no-such-group-here" on this machine; give a group name from /etc/group or a numeric GID`},
		{"flags refused together", []string{"serve", "--backend", "file://" + existing, "--ssd-size", "1GiB"}, 2,
			"tierblk: --ssd-size: is set but ssd is not; give the SSD tier's path too"},
		{"SSD tier on the backend's file", []string{"serve", "--backend", "file://" + existing, "--nbd", sock, "--ssd", existing, "--meta", "/dev/tierblk-meta"}, 2,
			"tierblk: --ssd: " + existing + " is also the export's backend; an SSD tier needs a file or device of its own"},
		{"metadata directory on /dev", []string{"serve", "--backend", "file://" + existing, "--nbd", sock, "--ssd", existingSSD, "--meta", "/dev/tierblk-meta"}, 2,
			"tierblk: --meta: /dev/tierblk-meta is a block device's path; give a metadata directory on a file system"},
		{"record trace in a missing directory", []string{"serve", "--backend", "file://" + existing, "--nbd", sock, "--record-trace", filepath.Join(missing, "t.log")}, 1,
			"tierblk: --record-trace: open " + filepath.Join(missing, "t.log") + ": no such file or directory"},
		{"csi without a service", []string{"csi"}, 2, "tierblk: give --controller, --node or both: the services to serve"},
		{"csi attach that names no way", []string{"csi", "--node", "--attach", "iscsi"}, 2, `tierblk: --attach "iscsi": use auto, ublk or nbd`},
		{"csi controller without its directory", []string{"csi", "--controller"}, 2,
			"tierblk: --backing-dir: the controller needs the directory that holds dynamic volumes (a share every node mounts at the same path)"},
		{"csi endpoint not an absolute path", []string{"csi", "--node", "--endpoint", "unix:csi.sock"}, 2,
			`tierblk: --endpoint "unix:csi.sock": give a unix socket's absolute path, as unix:///csi/csi.sock`},
		// At run time: what was typed is well formed, what it names fails.
		{"daemon not answering", []string{"stats", "--admin", "unix:" + filepath.Join(dir, "admin.sock")}, 1,
			"tierblk: no tierblk admin endpoint at unix:" + filepath.Join(dir, "admin.sock") + ": "},
		{"backend is a directory", []string{"serve", "--backend", "file://" + dir, "--nbd", sock}, 1, "tierblk: --backend: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, stderr := asTierblk(t, tc.args...)
			first, _, _ := strings.Cut(stderr, "\n")
			require.Equal(t, tc.code, code, "exit status of tierblk %s:\n%s", strings.Join(tc.args, " "), stderr)
			if strings.HasSuffix(tc.first, ": ") {
				require.True(t, strings.HasPrefix(first, tc.first), "stderr's first line: %q, want it to begin with %q", first, tc.first)
			} else {
				require.Equal(t, tc.first, first, "stderr's first line")
			}
			require.NoFileExists(t, missing, "a failed start created the backend's file")
			require.NoFileExists(t, ssd, "a failed start created the SSD tier's file")
		})
	}
}

// --version and -v print what `tierblk version` prints.
func TestVersionFlag(t *testing.T) {
	code, want, stderr := asTierblk(t, "version")
	require.Zero(t, code, stderr)
	require.True(t, strings.HasPrefix(want, "tierblk dev (go"), want)
	for _, flag := range []string{"--version", "-v"} {
		code, out, stderr := asTierblk(t, flag)
		require.Zero(t, code, "tierblk %s: %s", flag, stderr)
		require.Equal(t, want, out, "tierblk %s", flag)
		require.Empty(t, stderr, "tierblk %s", flag)
	}
}
