package nbd

// Tests of the server with real NBD clients from libnbd and qemu (skipped where they are not
// installed; make test installs them).

import (
	"bytes"
	"context"
	"encoding/json"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/volume"
)

func needTool(t *testing.T, name string) {
	t.Helper()
	if _, err := exec.LookPath(name); err != nil {
		t.Skipf("%s not installed (apt-get install libnbd-bin qemu-utils)", name)
	}
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	require.NoError(t, err, "%s %s:\n%s", name, strings.Join(args, " "), out)
	return string(out)
}

func TestNbdinfo(t *testing.T) {
	needTool(t, "nbdinfo")
	rw, _ := newVolume(3<<20, 0, volume.Options{MultiConn: true})
	ro, _ := newVolume(1<<20, 0, volume.Options{ReadOnly: true})
	plain := volume.New(plainBackend{newMem(2<<20, 0)}, volume.Options{})
	ts := startServer(t, ServerConfig{Exports: []Export{
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
		{ts.uri(""), export{Name: "rw", Description: "scratch disk", Size: 3 << 20, Min: 1, Preferred: 4096, Max: 32 << 20,
			CanCache: true, CanDF: true, CanFastZero: true, CanFlush: true, CanFUA: true, CanMultiConn: true, CanTrim: true, CanZero: true}},
		{"nbd://" + ts.tcp + "/ro", export{Name: "ro", Size: 1 << 20, Min: 1, Preferred: 4096, Max: 32 << 20,
			ReadOnly: true, CanCache: true, CanDF: true, CanFlush: true}},
		{ts.uri("plain"), export{Name: "plain", Size: 2 << 20, Min: 1, Preferred: 4096, Max: 32 << 20,
			CanCache: true, CanDF: true, CanFlush: true, CanFUA: true, CanZero: true}},
	} {
		t.Run(tc.want.Name, func(t *testing.T) {
			out := run(t, "nbdinfo", "--json", tc.uri)
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
		out := run(t, "nbdinfo", "--list", "--json", ts.uri(""))
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

func TestQemuIO(t *testing.T) {
	needTool(t, "qemu-io")
	for _, network := range []string{"unix", "tcp"} {
		t.Run(network, func(t *testing.T) {
			dev, mem := newVolume(1<<20, 0x5a, volume.Options{})
			ts := startServer(t, ServerConfig{Exports: []Export{{Name: "disk", Device: dev}}})
			uri := ts.uri("disk")
			if network == "tcp" {
				uri = "nbd://" + ts.tcp + "/disk"
			}
			out := run(t, "qemu-io", "-f", "raw", uri,
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
			require.True(t, bytes.Equal(want, mem.snapshot()), "device content after qemu-io")
		})
	}
}

func TestNbdcopyRoundTrip(t *testing.T) {
	needTool(t, "nbdcopy")
	const size = 64 << 20
	dir := t.TempDir()
	in := make([]byte, size)
	rng := rand.NewChaCha8([32]byte{1})
	rng.Read(in)
	clear(in[8<<20 : 16<<20]) // a run of zeroes, which nbdcopy writes as zeroes, not data
	inPath, outPath := filepath.Join(dir, "in.img"), filepath.Join(dir, "out.img")
	require.NoError(t, os.WriteFile(inPath, in, 0o600))

	dev, mem := newVolume(size, 0xff, volume.Options{MultiConn: true})
	ts := startServer(t, ServerConfig{Exports: []Export{{Device: dev}}})
	run(t, "nbdcopy", "--flush", inPath, ts.uri(""))
	require.True(t, bytes.Equal(in, mem.snapshot()), "device content after nbdcopy in")
	run(t, "nbdcopy", "nbd://"+ts.tcp, outPath)
	out, err := os.ReadFile(outPath)
	require.NoError(t, err)
	require.True(t, bytes.Equal(in, out), "nbdcopy out differs")
}
