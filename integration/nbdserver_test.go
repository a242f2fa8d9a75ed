package integration

// Tests of the NBD server (internal/nbd/server), run in this process over exports a test makes
// (a read-only one, one over a backend without trim or fast zeroes), with real NBD clients from
// libnbd and qemu.

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/nbd/nbdtest"
	"github.com/tierblk/tierblk/internal/nbd/server"
	"github.com/tierblk/tierblk/internal/volume"
)

// startServer serves cfg in this process on a unix socket and a TCP port until the test ends.
func startServer(t *testing.T, cfg server.Config) *nbdtest.Addrs {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = nbdtest.Logger(t, slog.LevelWarn)
	}
	s, err := server.New(cfg)
	require.NoError(t, err)
	return nbdtest.Serve(t, s)
}

func TestServerNbdinfo(t *testing.T) {
	requireTools(t, "nbdinfo")
	rw, _ := nbdtest.NewVolume(3<<20, 0, volume.Options{MultiConn: true})
	ro, _ := nbdtest.NewVolume(1<<20, 0, volume.Options{ReadOnly: true})
	plain := volume.New(nbdtest.Plain{Backend: nbdtest.NewMem(2<<20, 0)}, volume.Options{})
	ts := startServer(t, server.Config{Exports: []server.Export{
		{Name: "rw", Description: "scratch disk", Device: rw},
		{Name: "ro", Device: ro},
		{Name: "plain", Device: plain},
	}})

	type export struct {
		Name         string `json:"export-name"`
		Description  string `json:"description"`
		Size         int64  `json:"export-size"`
		Min          uint32 `json:"block_size_minimum"`
		Preferred    uint32 `json:"block_size_preferred"`
		Max          uint32 `json:"block_size_maximum"`
		ReadOnly     bool   `json:"is_read_only"`
		Rotational   bool   `json:"is_rotational"`
		CanCache     bool   `json:"can_cache"`
		CanDF        bool   `json:"can_df"`
		CanFastZero  bool   `json:"can_fast_zero"`
		CanFlush     bool   `json:"can_flush"`
		CanFUA       bool   `json:"can_fua"`
		CanMultiConn bool   `json:"can_multi_conn"`
		CanTrim      bool   `json:"can_trim"`
		CanZero      bool   `json:"can_zero"`
	}
	for _, tc := range []struct {
		uri  string
		want export
	}{
		{ts.URI(""), export{Name: "rw", Description: "scratch disk", Size: 3 << 20, Min: 1, Preferred: 4096, Max: 32 << 20,
			CanCache: true, CanDF: true, CanFastZero: true, CanFlush: true, CanFUA: true, CanMultiConn: true, CanTrim: true, CanZero: true}},
		{"nbd://" + ts.TCP + "/ro", export{Name: "ro", Size: 1 << 20, Min: 1, Preferred: 4096, Max: 32 << 20,
			ReadOnly: true, CanCache: true, CanDF: true, CanFlush: true}},
		{ts.URI("plain"), export{Name: "plain", Size: 2 << 20, Min: 1, Preferred: 4096, Max: 32 << 20,
			CanCache: true, CanDF: true, CanFlush: true, CanFUA: true, CanZero: true}},
	} {
		t.Run(tc.want.Name, func(t *testing.T) {
			out := mustRunTool(t, "nbdinfo", "--json", tc.uri)
			var got struct {
				Protocol   string   `json:"protocol"`
				Structured bool     `json:"structured"`
				Exports    []export `json:"exports"`
			}
			require.NoError(t, json.Unmarshal([]byte(out), &got), out)
			require.Equal(t, "newstyle-fixed", got.Protocol)
			require.True(t, got.Structured)
			require.Equal(t, []export{tc.want}, got.Exports)
		})
	}

	t.Run("list", func(t *testing.T) {
		out := mustRunTool(t, "nbdinfo", "--list", "--json", ts.URI(""))
		var got struct {
			Exports []export `json:"exports"`
		}
		require.NoError(t, json.Unmarshal([]byte(out), &got), out)
		var names []string
		for _, e := range got.Exports {
			names = append(names, e.Name+":"+e.Description)
		}
		require.Equal(t, []string{"rw:scratch disk", "ro:", "plain:"}, names)
	})
}

func TestServerQemuIO(t *testing.T) {
	requireTools(t, "qemu-io")
	for _, network := range []string{"unix", "tcp"} {
		t.Run(network, func(t *testing.T) {
			dev, mem := nbdtest.NewVolume(1<<20, 0x5a, volume.Options{})
			ts := startServer(t, server.Config{Exports: []server.Export{{Name: "disk", Device: dev}}})
			uri := ts.URI("disk")
			if network == "tcp" {
				uri = "nbd://" + ts.TCP + "/disk"
			}
			out := mustRunTool(t, "qemu-io", "-f", "raw", uri,
				"-c", "write -P 0xab 0 64k",
				"-c", "read -P 0xab 0 64k",
				"-c", "write -z 64k 64k",
				"-c", "read -P 0 64k 64k",
				"-c", "discard 128k 64k",
				"-c", "write -f -P 0xcd 192k 4k",
				"-c", "aio_write -P 0x01 256k 4k",
				"-c", "aio_write -P 0x02 260k 4k",
				"-c", "aio_flush",
				"-c", "read -P 0x5a 264k 4k",
				"-c", "flush",
			)
			require.NotContains(t, strings.ToLower(out), "fail", out)
			require.NotContains(t, strings.ToLower(out), "error", out)

			want := bytes.Repeat([]byte{0x5a}, 1<<20)
			copy(want, bytes.Repeat([]byte{0xab}, 64<<10))
			clear(want[64<<10 : 192<<10]) // zeroed, then discarded (the test backend's trim zeroes)
			copy(want[192<<10:], bytes.Repeat([]byte{0xcd}, 4<<10))
			copy(want[256<<10:], bytes.Repeat([]byte{0x01}, 4<<10))
			copy(want[260<<10:], bytes.Repeat([]byte{0x02}, 4<<10))
			require.True(t, bytes.Equal(want, mem.Snapshot()), "device content after qemu-io")
		})
	}
}

func TestServerNbdcopyRoundTrip(t *testing.T) {
	requireTools(t, "nbdcopy")
	const size = 64 << 20
	dir := t.TempDir()
	in := make([]byte, size)
	rng := rand.NewChaCha8([32]byte{1})
	rng.Read(in)
	clear(in[8<<20 : 16<<20]) // a run of zeroes, which nbdcopy writes as zeroes, not data
	inPath, outPath := filepath.Join(dir, "in.img"), filepath.Join(dir, "out.img")
	require.NoError(t, os.WriteFile(inPath, in, 0o600))

	dev, mem := nbdtest.NewVolume(size, 0xff, volume.Options{MultiConn: true})
	ts := startServer(t, server.Config{Exports: []server.Export{{Device: dev}}})
	mustRunTool(t, "nbdcopy", "--flush", inPath, ts.URI(""))
	require.True(t, bytes.Equal(in, mem.Snapshot()), "device content after nbdcopy in")
	mustRunTool(t, "nbdcopy", "nbd://"+ts.TCP, outPath)
	out, err := os.ReadFile(outPath)
	require.NoError(t, err)
	require.True(t, bytes.Equal(in, out), "nbdcopy out differs")
}

// TestServerReadOnlyQemuIO: qemu-io's write to a read-only export fails with EPERM's message and
// leaves the device as it was (TestReadOnlyExport of the server checks the protocol itself).
func TestServerReadOnlyQemuIO(t *testing.T) {
	requireTools(t, "qemu-io")
	dev, mem := nbdtest.NewVolume(1<<20, 0x77, volume.Options{ReadOnly: true})
	ts := startServer(t, server.Config{Exports: []server.Export{{Device: dev}}, Logger: slog.New(slog.DiscardHandler)})
	initial := mem.Snapshot()
	out, _ := qemuIO(t, ts.URI(""), "write -P 0xab 0 4k")
	require.Contains(t, strings.ToLower(out), "permission denied", "qemu-io output: %s", out)
	require.True(t, bytes.Equal(initial, mem.Snapshot()))
}
