package ublk

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/tierblk/tierblk/internal/volume"
)

// fakeVolume records the last call made to it and fails with err.
type fakeVolume struct {
	call string
	data []byte
	err  error
}

func (f *fakeVolume) Info() volume.Info { return volume.Info{} }

func (f *fakeVolume) ReadAt(p []byte, off int64) error {
	f.call = fmt.Sprintf("read %d+%d", off, len(p))
	copy(p, f.data)
	return f.err
}

func (f *fakeVolume) WriteAt(p []byte, off int64, fua bool) error {
	f.call = fmt.Sprintf("write %d+%d fua=%v", off, len(p), fua)
	f.data = append([]byte(nil), p...)
	return f.err
}

func (f *fakeVolume) Flush() error {
	f.call = "flush"
	return f.err
}

func (f *fakeVolume) Trim(off, length int64, fua bool) error {
	f.call = fmt.Sprintf("trim %d+%d fua=%v", off, length, fua)
	return f.err
}

func (f *fakeVolume) WriteZeroes(off, length int64, z volume.ZeroFlags) error {
	f.call = fmt.Sprintf("zero %d+%d nohole=%v fast=%v fua=%v", off, length, z.NoHole, z.Fast, z.FUA)
	return f.err
}

func (f *fakeVolume) Cache(off, length int64) error {
	f.call = "cache"
	return f.err
}

func TestHandle(t *testing.T) {
	failed := errors.New("backend failed")
	for _, tc := range []struct {
		name     string
		d        ioDesc
		err      error
		wantCall string
		wantRes  int32
	}{
		{"read", ioDesc{OpFlags: opRead, NrSectors: 8, StartSector: 2}, nil, "read 1024+4096", 4096},
		{"write", ioDesc{OpFlags: opWrite, NrSectors: 1, StartSector: 3}, nil, "write 1536+512 fua=false", 512},
		{"write FUA", ioDesc{OpFlags: opWrite | ioFlagFUA, NrSectors: 2}, nil, "write 0+1024 fua=true", 1024},
		{"flush", ioDesc{OpFlags: opFlush}, nil, "flush", 0},
		{"discard", ioDesc{OpFlags: opDiscard, NrSectors: 1 << 20, StartSector: 8}, nil, "trim 4096+536870912 fua=false", 0},
		{"write zeroes", ioDesc{OpFlags: opWriteZeroes, NrSectors: 16, StartSector: 16}, nil, "zero 8192+8192 nohole=false fast=false fua=false", 0},
		{"write zeroes, no unmap, FUA", ioDesc{OpFlags: opWriteZeroes | ioFlagNoUnmap | ioFlagFUA, NrSectors: 16}, nil, "zero 0+8192 nohole=true fast=false fua=true", 0},
		{"read error", ioDesc{OpFlags: opRead, NrSectors: 1}, failed, "read 0+512", -int32(unix.EIO)},
		{"write error", ioDesc{OpFlags: opWrite, NrSectors: 1}, failed, "write 0+512 fua=false", -int32(unix.EIO)},
		{"flush error", ioDesc{OpFlags: opFlush}, failed, "flush", -int32(unix.EIO)},
		{"zeroes not supported", ioDesc{OpFlags: opWriteZeroes, NrSectors: 1}, volume.ErrNotSupported, "zero 0+512 nohole=false fast=false fua=false", -int32(unix.EOPNOTSUPP)},
		{"larger than the buffer", ioDesc{OpFlags: opRead, NrSectors: 9}, nil, "", -int32(unix.EINVAL)},
		{"unknown operation", ioDesc{OpFlags: 4}, nil, "", -int32(unix.EOPNOTSUPP)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeVolume{err: tc.err, data: bytes.Repeat([]byte{0xab}, 4096)}
			buf := make([]byte, 4096)
			res, err := handle(f, tc.d, buf)
			require.Equal(t, tc.wantRes, res)
			require.Equal(t, tc.wantCall, f.call)
			// Failures worth a log line come with an error; an unknown operation does not.
			require.Equal(t, tc.err != nil || tc.wantRes == -int32(unix.EINVAL), err != nil, "error: %v", err)
		})
	}
}

// A read fills the request's buffer; a write hands the volume what the buffer holds.
func TestHandleData(t *testing.T) {
	f := &fakeVolume{data: []byte("from the volume")}
	buf := make([]byte, 4096)
	res, err := handle(f, ioDesc{OpFlags: opRead, NrSectors: 1}, buf)
	require.NoError(t, err)
	require.Equal(t, int32(512), res)
	require.Equal(t, "from the volume", string(buf[:15]))

	copy(buf, "to the volume")
	_, err = handle(f, ioDesc{OpFlags: opWrite, NrSectors: 1}, buf)
	require.NoError(t, err)
	require.Equal(t, buf[:512], f.data)
}

// gateVolume is fakeVolume whose writes wait for a token on gate.
type gateVolume struct {
	fakeVolume
	gate chan struct{}
}

func (g *gateVolume) WriteAt(p []byte, off int64, fua bool) error {
	<-g.gate
	return nil
}

// Requests the volume cannot serve on the ring go to workers: a new one while none is idle, up to
// the queue's depth, then handed to the next worker free; every request is handed back once; the
// workers leave once the loop has closed work.
func TestWorkers(t *testing.T) {
	const depth = 8
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	require.NoError(t, err)
	g := &gateVolume{gate: make(chan struct{})}
	q := &queue{depth: depth, maxIO: 4096, dev: g, efd: efd, work: make(chan request),
		iods: make([]byte, depth*sizeofIODesc), bufs: make([]byte, depth*4096)}
	t.Cleanup(func() { unix.Close(efd) })
	for tag := range depth {
		*(*ioDesc)(unsafe.Pointer(&q.iods[tag*sizeofIODesc])) = ioDesc{OpFlags: opWrite, NrSectors: 8, StartSector: uint64(8 * tag)}
	}
	// batch dispatches every tag and lets the writes end, then waits for them.
	batch := func() {
		for tag := range depth {
			q.dispatch(uint16(tag))
		}
		for range depth {
			g.gate <- struct{}{}
		}
		seen := map[uint16]bool{}
		for len(seen) < depth {
			done, _ := q.takeDone(false)
			for _, c := range done {
				require.False(t, seen[c.tag], "tag %d handed back twice", c.tag)
				require.Equal(t, int32(4096), c.res)
				seen[c.tag] = true
			}
			if len(seen) < depth {
				time.Sleep(time.Millisecond)
			}
		}
	}
	batch() // the writes wait on the volume until every one was dispatched
	require.Equal(t, depth, q.started, "a worker for each request waiting on the volume")
	batch() // each handed to a worker free, or about to be
	require.Equal(t, depth, q.started)
	close(q.work)
	q.workers.Wait()
}
