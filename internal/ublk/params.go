package ublk

import (
	"math/bits"

	"golang.org/x/sys/unix"

	"github.com/tierblk/tierblk/internal/volume"
)

// maxIO is the largest request to ask of the kernel: maxIOBytes, or less if the volume takes
// less, in whole pages.
func maxIO(info volume.Info) int {
	n := maxIOBytes
	if info.MaxBlock > 0 {
		n = min(n, int(info.MaxBlock))
	}
	return max(n/unix.Getpagesize()*unix.Getpagesize(), unix.Getpagesize())
}

// DefaultBufferBytes is the default of Options.BufferBytes: 2 queues of 32 tags with requests of
// up to 128 KiB, or 16 queues of 16 with 32 KiB. The buffers are the daemon's memory (RSS) once
// touched, whatever the load; docs/operations.md, "How much RAM", counts them.
const DefaultBufferBytes = 8 << 20

// The smallest the buffers' fitting makes a request and a queue; below them, a request of the
// kernel's goes in many parts and a queue holds few.
const (
	minFitIO    = 128 << 10
	minFitDepth = 16
)

// fitBuffers returns the depth and largest request that keep queues x depth x maxIO within
// budget: the requests are made smaller first, to minFitIO, then the queues shallower, to
// minFitDepth, then the requests smaller again, to a page; requests stay whole pages.
func fitBuffers(queues, depth, maxIO, budget int) (int, int) {
	page := unix.Getpagesize()
	fits := func() bool { return queues*depth*maxIO <= budget }
	if !fits() && maxIO > minFitIO {
		maxIO = max(budget/(queues*depth)/page*page, minFitIO)
	}
	if !fits() && depth > minFitDepth {
		depth = max(budget/(queues*maxIO), minFitDepth)
	}
	if !fits() {
		maxIO = max(budget/(queues*depth)/page*page, page)
	}
	return depth, maxIO
}

// Discard and write-zeroes requests are split by the kernel at these sizes (in sectors), which
// bounds how long one request holds the volume.
const (
	maxDiscardSectors     = 1 << 17 // 64 MiB
	maxWriteZeroesSectors = 1 << 17
	discardGranularity    = 4096
)

// deviceParams describes the volume to the kernel: 512-byte logical blocks, a volatile write
// cache (so that the kernel sends flushes) with FUA, and discard and write-zeroes when the
// volume has them.
func deviceParams(info volume.Info, maxIO uint32) params {
	p := params{Len: sizeofParams, Types: paramTypeBasic}
	phys := uint8(12)
	if pb := info.PreferredBlock; pb >= 512 && pb <= 4096 && pb&(pb-1) == 0 {
		phys = uint8(bits.TrailingZeros32(pb))
	}
	p.Basic = paramBasic{
		LogicalBSShift:  sectorShift,
		PhysicalBSShift: phys,
		IOOptShift:      phys,
		IOMinShift:      sectorShift,
		MaxSectors:      maxIO >> sectorShift,
		DevSectors:      uint64(info.Size) >> sectorShift,
	}
	if info.ReadOnly {
		p.Basic.Attrs = attrReadOnly
		return p
	}
	p.Basic.Attrs = attrVolatileCache
	if info.CanFUA {
		p.Basic.Attrs |= attrFUA
	}
	// The kernel (6.12) takes the write-zeroes limit from the discard parameters only.
	if info.CanTrim || info.CanZero {
		p.Types |= paramTypeDiscard
		p.Discard = paramDiscard{DiscardGranularity: discardGranularity, MaxDiscardSegments: 1}
		if info.CanTrim {
			p.Discard.MaxDiscardSectors = maxDiscardSectors
		}
		if info.CanZero {
			p.Discard.MaxWriteZeroesSectors = maxWriteZeroesSectors
		}
	}
	return p
}
