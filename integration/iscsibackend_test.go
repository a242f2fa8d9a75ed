package integration

// Tests of the iSCSI backend (pkg/backend/iscsi) against tgtd: the backend conformance suite on a
// thin-provisioned LUN and on a fully provisioned one with 4 KiB blocks and CRC32C digests; space
// given back by trim and write-zeroes; CHAP with the right and the wrong secrets, one-way and
// mutual; read-only opening and a write-protected LUN; the errors of opening what is not there. The
// backend is opened by URL through the daemon's registry, as `tierblk serve --backend` opens it.

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/pkg/backend"
	"github.com/tierblk/tierblk/pkg/backend/backendtest"
	"github.com/tierblk/tierblk/pkg/backend/iscsi"
	"github.com/tierblk/tierblk/pkg/backend/registry"
)

func TestISCSIBackendConformance(t *testing.T) {
	srv := startTGTD(t)
	backendtest.Run(t, func(t *testing.T, size int64) backend.Backend {
		u, _ := srv.newLUN(t, size, lunOptions{thin: true})
		return openBackend(t, u, backend.Options{})
	})
}

// noTrim hides a backend's Trimmer: a fully provisioned LUN has no UNMAP, so its Trim fails with
// ErrNotSupported, which the suite would take for a broken trim.
type noTrim struct {
	backend.Backend
	backend.ZeroWriter
	backend.FUAWriter
}

// On a LUN with 4 KiB logical blocks every 512-byte-aligned request is a read-modify-write, and
// digests cover every PDU; without thin provisioning, write-zeroes is WRITE SAME without UNMAP.
func TestISCSIBackendConformance4KDigests(t *testing.T) {
	srv := startTGTD(t)
	backendtest.Run(t, func(t *testing.T, size int64) backend.Backend {
		u, _ := srv.newLUN(t, size, lunOptions{blockSize: 4096, digests: true})
		b := openBackend(t, u+"?header_digest=crc32c&data_digest=crc32c", backend.Options{})
		err := b.(backend.Trimmer).Trim(0, 1<<20)
		require.ErrorIs(t, err, backend.ErrNotSupported, "trim on a LUN without UNMAP")
		return noTrim{b, b.(backend.ZeroWriter), b.(backend.FUAWriter)}
	})
}

// allocated is the disk space a file takes.
func allocated(t *testing.T, path string) int64 {
	t.Helper()
	var st syscall.Stat_t
	require.NoError(t, syscall.Stat(path, &st))
	return st.Blocks * 512
}

// On a thin LUN, trim (UNMAP) and write-zeroes that may unmap (WRITE SAME with UNMAP) give the
// space back: tgtd punches holes in its file.
func TestISCSIBackendThinProvisioning(t *testing.T) {
	srv := startTGTD(t)
	u, img := srv.newLUN(t, 8<<20, lunOptions{thin: true})
	b := openBackend(t, u, backend.Options{})
	defer b.Close()
	_, err := b.WriteAt(backendtest.Pattern(1, 8<<20), 0)
	require.NoError(t, err)
	require.NoError(t, b.Flush())
	full := allocated(t, img)
	require.GreaterOrEqual(t, full, int64(8<<20))

	require.NoError(t, b.(backend.Trimmer).Trim(0, 4<<20))
	require.LessOrEqual(t, allocated(t, img), full-4<<20, "after trimming 4 MiB")
	require.NoError(t, b.(backend.ZeroWriter).WriteZeroes(4<<20, 2<<20, true))
	require.LessOrEqual(t, allocated(t, img), full-6<<20, "after write-zeroes of 2 MiB that may unmap")
	require.NoError(t, b.(backend.ZeroWriter).WriteZeroes(6<<20, 2<<20, false))
	require.GreaterOrEqual(t, allocated(t, img), int64(2<<20), "write-zeroes that must not unmap")

	got := make([]byte, 8<<20)
	_, err = b.ReadAt(got, 0)
	require.NoError(t, err)
	require.Equal(t, make([]byte, 8<<20), got)
}

func TestISCSIBackendCHAP(t *testing.T) {
	srv := startTGTD(t)
	u, _ := srv.newLUN(t, 1<<20, lunOptions{user: "alice", password: "alice-secret-12"})
	host, rest, _ := strings.Cut(strings.TrimPrefix(u, "iscsi://"), "/")
	withUser := func(userinfo string) string { return "iscsi://" + userinfo + "@" + host + "/" + rest }
	open := func(rawURL string) (backend.Backend, error) {
		return registry.Default().Open(rawURL, backend.Options{})
	}

	t.Run("libiscsi form", func(t *testing.T) {
		b, err := open(withUser("alice%alice-secret-12"))
		require.NoError(t, err)
		require.NoError(t, b.Close())
	})
	t.Run("RFC 3986 form", func(t *testing.T) {
		b, err := open(withUser("alice:alice-secret-12"))
		require.NoError(t, err)
		require.NoError(t, b.Close())
	})
	t.Run("environment", func(t *testing.T) {
		t.Setenv(iscsi.EnvUser, "alice")
		t.Setenv(iscsi.EnvPassword, "alice-secret-12")
		b, err := open(u)
		require.NoError(t, err)
		require.NoError(t, b.Close())
	})
	t.Run("user in the URL, password in the environment", func(t *testing.T) {
		t.Setenv(iscsi.EnvPassword, "alice-secret-12")
		b, err := open(withUser("alice"))
		require.NoError(t, err)
		require.NoError(t, b.Close())
	})
	t.Run("wrong secret", func(t *testing.T) {
		_, err := open(withUser("alice%wrong-secret-1"))
		require.ErrorIs(t, err, iscsi.ErrAuthFailed)
		require.ErrorContains(t, err, "authentication failed")
		require.ErrorContains(t, err, `refused CHAP user "alice"`)
		require.ErrorContains(t, err, rest[:strings.LastIndex(rest, "/")], "names the target")
		require.NotContains(t, err.Error(), "wrong-secret-1")
	})
	t.Run("unknown user", func(t *testing.T) {
		_, err := open(withUser("bob%alice-secret-12"))
		require.ErrorIs(t, err, iscsi.ErrAuthFailed)
	})
	t.Run("no credentials", func(t *testing.T) {
		_, err := open(u)
		require.ErrorIs(t, err, iscsi.ErrAuthFailed)
		require.ErrorContains(t, err, iscsi.EnvUser)
	})
}

func TestISCSIBackendMutualCHAP(t *testing.T) {
	srv := startTGTD(t)
	u, _ := srv.newLUN(t, 1<<20, lunOptions{user: "alice", password: "alice-secret-12",
		targetUser: "target1", targetPassword: "target-secret-1"})
	t.Setenv(iscsi.EnvUser, "alice")
	t.Setenv(iscsi.EnvPassword, "alice-secret-12")

	t.Setenv(iscsi.EnvTargetUser, "target1")
	t.Setenv(iscsi.EnvTargetPassword, "target-secret-1")
	b := openBackend(t, u, backend.Options{})
	require.NoError(t, b.Close())

	// A target that does not know the secret we expect of it is refused.
	t.Setenv(iscsi.EnvTargetPassword, "not-the-target-secret")
	_, err := registry.Default().Open(u, backend.Options{})
	require.ErrorIs(t, err, iscsi.ErrAuthFailed)
	require.ErrorContains(t, err, `does not know the mutual CHAP secret of "target1"`)
}

func TestISCSIBackendReadOnly(t *testing.T) {
	srv := startTGTD(t)
	lun := func(t *testing.T, content []byte, o lunOptions) string {
		u, img := srv.newLUN(t, int64(len(content)), o)
		require.NoError(t, os.WriteFile(img, content, 0o600))
		return u
	}
	t.Run("opened read-only", func(t *testing.T) {
		backendtest.RunReadOnly(t, func(t *testing.T, content []byte) backend.Backend {
			return openBackend(t, lun(t, content, lunOptions{thin: true}), backend.Options{ReadOnly: true})
		})
	})
	t.Run("write-protected LUN", func(t *testing.T) {
		backendtest.RunReadOnly(t, func(t *testing.T, content []byte) backend.Backend {
			return openBackend(t, lun(t, content, lunOptions{thin: true, readOnly: true}), backend.Options{})
		})
	})
}

func TestISCSIBackendOpenErrors(t *testing.T) {
	srv := startTGTD(t)
	u, _ := srv.newLUN(t, 1<<20, lunOptions{})
	base := strings.TrimSuffix(u, "/1")
	for _, c := range []struct {
		url, err string
	}{
		{"iscsi://" + srv.Addr + "/iqn.2026-01.test.tierblk:nosuch/1", "target iqn.2026-01.test.tierblk:nosuch not found"},
		{base + "/7", "has no LUN 7"},
		{base + "/0", "is not a disk (peripheral qualifier 0, device type 0x0c)"}, // tgtd's controller LUN
		{"iscsi://" + freeTCPAddr(t) + "/iqn.2026-01.test.tierblk:t1/1", "connection refused"},
		{base + "/1?header_digest=md5", "header_digest=md5 is neither crc32c nor none"},
	} {
		t.Run(c.url, func(t *testing.T) {
			_, err := registry.Default().Open(c.url, backend.Options{})
			require.ErrorContains(t, err, c.err)
		})
	}
}

// tierblk serve --backend iscsi://... exports the LUN over NBD: what qemu-io and fio write through
// it lands in tgtd's file, and reads back. Served directly with CHAP credentials from the
// environment, through a RAM cache with libiscsi's USER%PASSWORD in the URL, and through a RAM and
// an SSD tier (whose misses within a line the LUN reads asynchronously); the password never shows
// in the daemon's output.
func TestISCSIServe(t *testing.T) {
	requireTools(t, "qemu-io", "nbdinfo", "fio")
	srv := startTGTD(t)
	const size = 64 << 20
	const password = "serve-secret-123"
	for _, c := range []struct {
		name   string
		urlPwd bool // the password in the URL rather than the environment
		args   []string
		ssd    bool // an SSD tier too, in a directory of the test's
	}{
		{"direct, CHAP from the environment", false, nil, false},
		{"RAM cache, CHAP in the URL", true, []string{"--ram", "16MiB"}, false},
		{"RAM and SSD cache", false, []string{"--ram", "1MiB"}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.ssd {
				dir := t.TempDir()
				c.args = append(c.args, "--ssd", filepath.Join(dir, "ssd.img"), "--ssd-size", "32MiB",
					"--meta", filepath.Join(dir, "meta"), "--run-dir", filepath.Join(dir, "run"))
			}
			u, img := srv.newLUN(t, size, lunOptions{thin: true, user: "tierblk", password: password})
			if c.urlPwd {
				u = strings.Replace(u, "iscsi://", "iscsi://tierblk%"+password+"@", 1)
			} else {
				t.Setenv(iscsi.EnvUser, "tierblk")
				t.Setenv(iscsi.EnvPassword, password)
			}
			// Data the daemon has never seen, for reads that miss every tier.
			lunFile, err := os.OpenFile(img, os.O_WRONLY, 0)
			require.NoError(t, err)
			_, err = lunFile.WriteAt(bytes.Repeat([]byte{0x5a}, 1<<20), 16<<20)
			require.NoError(t, errors.Join(err, lunFile.Close()))
			d := startServe(t, append([]string{"--backend", u, "--log-level", "debug"}, c.args...)...)
			uri := unixURI(d.Unix, "")
			mustQemuIO(t, uri, "read -P 0x5a 16M 4k", "read -P 0x5a 16392k 8k", "read -P 0x5a 16900k 1000")

			info := nbdInfo(t, uri, false)
			require.Len(t, info, 1)
			require.Equal(t, int64(size), info[0].Size)
			require.True(t, info[0].Trim && info[0].Zero && info[0].FUA && info[0].Flush, "%+v", info[0])

			mustQemuIO(t, uri,
				"write -P 0xab 0 1M", "write -P 0xcd 1000 3000", "write -z 2M 1M", "flush",
				"read -P 0xab 0 1000", "read -P 0xcd 1000 3000", "read -P 0xab 4000 1044576", "read -P 0 2M 1M")
			disk, err := os.ReadFile(img)
			require.NoError(t, err)
			require.Equal(t, bytes.Repeat([]byte{0xcd}, 3000), disk[1000:4000], "tgtd's file holds what was written through tierblk")
			require.Equal(t, bytes.Repeat([]byte{0xab}, 1000), disk[:1000])

			fioVerify(t, uri, 2, "--name=verify", "--rw=randwrite", "--bsrange=512-64k", "--iodepth=16",
				"--size=4m", "--offset=8m", "--offset_increment=4m")

			d.requireStop(syscall.SIGTERM)
			out := d.output.String()
			require.NotContains(t, out, password)
			if c.urlPwd {
				require.Contains(t, out, "iscsi://tierblk:xxxxx@", "the export's log line shows the URL redacted")
			}
		})
	}
}

// tgtd killed (SIGKILL, as a crash would) and started again in the middle of a workload: the
// backend logs in again and the writes that were in flight run again, so writers stall and go on
// and none fails. A flush after the crash may say that acknowledged writes could have been lost
// (the backend cannot tell a target that lost its cache from one that did not); the writers then
// write everything again, as the cache above would, and the next flush must succeed. What each
// writer had acknowledged is then on the LUN's file, and reads back through the backend.
func TestISCSIBackendTargetRestart(t *testing.T) {
	srv := startTGTD(t)
	const size, block, writers = 16 << 20, 4096, 8
	u, img := srv.newLUN(t, size, lunOptions{thin: true})
	b := openBackend(t, u+"?reconnect-wait=1m", backend.Options{})

	// Writer w owns the blocks b with b%writers == w; last[b] is the round of its last
	// acknowledged write (0: never written), which the block's bytes spell.
	blocks := size / block
	last := make([]uint32, blocks)
	pattern := func(blk int, round uint32) []byte {
		p := make([]byte, block)
		for i := 0; i < block; i += 8 {
			binary.LittleEndian.PutUint32(p[i:], uint32(blk))
			binary.LittleEndian.PutUint32(p[i+4:], round)
		}
		return p
	}
	var (
		stop    atomic.Bool
		written atomic.Int64
		wg      sync.WaitGroup
	)
	for w := range writers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for round := uint32(1); !stop.Load(); round++ {
				blk := w + writers*rng.IntN(blocks/writers)
				if _, err := b.WriteAt(pattern(blk, round), int64(blk)*block); err != nil {
					t.Errorf("writer %d: a write failed across the restart: %v", w, err)
					return
				}
				last[blk] = round
				written.Add(1)
			}
		})
	}
	waitWritten := func(n int64) {
		require.Eventually(t, func() bool { return written.Load() >= n }, 30*time.Second, 10*time.Millisecond)
	}
	waitWritten(2000)
	require.NoError(t, b.Flush())
	before := written.Load()
	srv.restart(t, 500*time.Millisecond)
	waitWritten(before + 2000) // the writers go on after the restart
	stop.Store(true)
	wg.Wait()

	if err := b.Flush(); err != nil {
		require.ErrorContains(t, err, "acknowledged writes not yet flushed")
		for blk, round := range last {
			if round > 0 {
				_, err := b.WriteAt(pattern(blk, round), int64(blk)*block)
				require.NoError(t, err)
			}
		}
		require.NoError(t, b.Flush(), "the loss is reported once")
	}
	disk, err := os.ReadFile(img)
	require.NoError(t, err)
	got := make([]byte, block)
	for blk, round := range last {
		want := make([]byte, block)
		if round > 0 {
			want = pattern(blk, round)
		}
		require.Equal(t, want, disk[blk*block:(blk+1)*block], "block %d in tgtd's file", blk)
		_, err := b.ReadAt(got, int64(blk)*block)
		require.NoError(t, err)
		require.Equal(t, want, got, "block %d read back", blk)
	}
	t.Logf("%d writes, %d of them after the restart", written.Load(), written.Load()-before)
}

// The whole stack across a target crash: tierblk serving a tgtd LUN through a write-back cache
// smaller than what fio writes, so that lines are destaged while tgtd is killed and started again.
// fio verifies every byte it wrote; after `tierblk flush`, the LUN's file holds what the export
// serves.
func TestISCSIWriteBackTargetRestart(t *testing.T) {
	requireTools(t, "fio", "nbdcopy")
	srv := startTGTD(t)
	u, img := srv.newLUN(t, 32<<20, lunOptions{thin: true})
	o := cacheOpts{backend: u, dir: shortTempDir(t), ram: "2MiB", ssdSize: "8MiB", line: "64KiB", mode: "writeback"}
	d := startServe(t, o.args()...)
	uri := unixURI(d.Unix, "")

	args, report := fioVerifyArgs(t, uri, 2, "--name=restart", "--rw=randwrite", "--bssplit=4k/50:64k/50",
		"--iodepth=8", "--size=12m", "--offset_increment=12m")
	type result struct {
		out string
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, err := runTool(t, "fio", args...)
		done <- result{out, err}
	}()
	require.Eventually(t, func() bool {
		_, dirty := adminDirty(t, o.admin())
		return dirty.DestagedBytes > 0
	}, time.Minute, 20*time.Millisecond, "destaging before the crash")
	srv.restart(t, time.Second)
	r := <-done
	require.NoError(t, r.err, "fio:\n%s", r.out)
	checkFioVerify(t, report, r.out, 2)

	flushAdmin(t, o.admin())
	served := filepath.Join(t.TempDir(), "served.img")
	mustRunTool(t, "nbdcopy", uri, served)
	want, err := os.ReadFile(served)
	require.NoError(t, err)
	got, err := os.ReadFile(img)
	require.NoError(t, err)
	require.True(t, bytes.Equal(want, got), "tgtd's file differs from what the export serves after tierblk flush")
	require.Contains(t, d.output.String(), "logged in again")
}
