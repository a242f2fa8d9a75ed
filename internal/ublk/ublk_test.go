package ublk

import (
	"os"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/tierblk/tierblk/internal/volume"
)

func TestDeviceParams(t *testing.T) {
	const size = 1<<30 + 4096
	for _, tc := range []struct {
		name        string
		info        volume.Info
		wantAttrs   uint32
		wantTypes   uint32
		wantDiscard paramDiscard
		wantPhys    uint8
	}{
		{"read-only", volume.Info{Size: size, ReadOnly: true, PreferredBlock: 4096}, attrReadOnly, paramTypeBasic, paramDiscard{}, 12},
		{"everything", volume.Info{Size: size, CanTrim: true, CanZero: true, CanFUA: true, PreferredBlock: 4096},
			attrVolatileCache | attrFUA, paramTypeBasic | paramTypeDiscard,
			paramDiscard{DiscardGranularity: 4096, MaxDiscardSectors: maxDiscardSectors, MaxWriteZeroesSectors: maxWriteZeroesSectors, MaxDiscardSegments: 1}, 12},
		{"zeroes without trim", volume.Info{Size: size, CanZero: true, PreferredBlock: 512},
			attrVolatileCache, paramTypeBasic | paramTypeDiscard,
			paramDiscard{DiscardGranularity: 4096, MaxWriteZeroesSectors: maxWriteZeroesSectors, MaxDiscardSegments: 1}, 9},
		{"neither, odd preferred block", volume.Info{Size: size, CanFUA: true, PreferredBlock: 3000},
			attrVolatileCache | attrFUA, paramTypeBasic, paramDiscard{}, 12},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := deviceParams(tc.info, 512<<10)
			require.Equal(t, uint32(sizeofParams), p.Len)
			require.Equal(t, tc.wantTypes, p.Types)
			require.Equal(t, tc.wantAttrs, p.Basic.Attrs)
			require.Equal(t, tc.wantDiscard, p.Discard)
			require.Equal(t, uint8(sectorShift), p.Basic.LogicalBSShift)
			require.Equal(t, tc.wantPhys, p.Basic.PhysicalBSShift)
			require.Equal(t, uint32(1024), p.Basic.MaxSectors)
			require.Equal(t, uint64(size/512), p.Basic.DevSectors)
		})
	}
}

func TestMaxIO(t *testing.T) {
	page := unix.Getpagesize()
	for _, tc := range []struct {
		maxBlock uint32
		want     int
	}{
		{0, maxIOBytes},
		{volume.DefaultMaxBlock, maxIOBytes},
		{64 << 10, 64 << 10},
		{uint32(page) + 100, page},
		{100, page},
	} {
		require.Equal(t, tc.want, maxIO(volume.Info{MaxBlock: tc.maxBlock}), "MaxBlock %d", tc.maxBlock)
	}
}

// The queues' buffers fit the budget, with requests made smaller before queues shallower.
func TestFitBuffers(t *testing.T) {
	page := unix.Getpagesize()
	for _, tc := range []struct {
		queues, depth, maxIO, budget int
		wantDepth, wantIO            int
	}{
		{1, 128, 128 << 10, 16 << 20, 128, 128 << 10}, // fits as it is
		{2, 128, maxIOBytes, 16 << 20, 64, minFitIO},  // smaller requests, then fewer tags
		{2, 32, maxIOBytes, 16 << 20, 32, 256 << 10},  // smaller requests suffice
		{16, 128, maxIOBytes, 16 << 20, 16, 64 << 10}, // down to minFitDepth, then requests again
		{64, 128, maxIOBytes, 4 << 20, 16, page},      // never below a page
		{2, 8, 64 << 10, 16 << 20, 8, 64 << 10},       // small already
	} {
		d, io := fitBuffers(tc.queues, tc.depth, tc.maxIO, tc.budget)
		require.Equal(t, tc.wantDepth, d, "%+v", tc)
		require.Equal(t, tc.wantIO, io, "%+v", tc)
		require.Zero(t, io%page)
	}
}

func TestAlive(t *testing.T) {
	require.False(t, alive(os.Getpid()), "this process is not another daemon")
	require.False(t, alive(-1))
	require.False(t, alive(0))

	cmd := exec.Command("sleep", "60")
	require.NoError(t, cmd.Start())
	require.True(t, alive(cmd.Process.Pid))
	require.NoError(t, cmd.Process.Kill())
	// Killed but not reaped (WNOWAIT): a zombie, gone for the kernel's purposes.
	var info unix.Siginfo
	require.NoError(t, unix.Waitid(unix.P_PID, cmd.Process.Pid, &info, unix.WEXITED|unix.WNOWAIT, nil))
	require.False(t, alive(cmd.Process.Pid))
	_ = cmd.Wait()
	require.False(t, alive(cmd.Process.Pid))
}

// Without ublk_drv (as on the build host) Start fails and says what is missing.
func TestStartWithoutDriver(t *testing.T) {
	if _, err := os.Stat(controlPath); err == nil {
		t.Skipf("%s exists: this test is for hosts without ublk_drv", controlPath)
	}
	_, err := Start(&fakeVolume{}, Options{ID: -1})
	require.ErrorIs(t, err, unix.ENOENT)
	require.ErrorContains(t, err, "ublk_drv")
}
