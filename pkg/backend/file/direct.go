package file

import (
	"unsafe"

	"github.com/tierblk/tierblk/internal/bufpool"
)

// Direct I/O (O_DIRECT) needs the file offset, the length and the buffer's address aligned. Requests
// that are not go through an aligned bounce buffer; writes of partial blocks become
// read-modify-write.
const (
	// dioAlign is the alignment used for direct I/O: 4096 suits devices with 512-byte and with
	// 4 KiB logical blocks, and every file system's block size tierblk is likely to meet.
	dioAlign = bufpool.Align
	// maxBounce bounds one bounce buffer; larger requests go through it in pieces.
	maxBounce = 1 << 20
)

func aligned(p []byte, off int64) bool {
	return off%dioAlign == 0 && len(p)%dioAlign == 0 &&
		(len(p) == 0 || uintptr(unsafe.Pointer(&p[0]))%dioAlign == 0)
}

func alignDown(x int64) int64 { return x &^ (dioAlign - 1) }

// window returns the aligned span [w, we) of the device that holds the first piece of the request
// [off, end): at most maxBounce bytes, and cut at the device's end, whose size is a multiple of the
// logical block size even when not of dioAlign.
func (f *File) window(off, end int64) (w, we int64) {
	w = alignDown(off)
	return w, min(alignDown(end+dioAlign-1), f.size, w+maxBounce)
}

func (f *File) bounceRead(p []byte, off int64) error {
	for len(p) > 0 {
		w, we := f.window(off, off+int64(len(p)))
		b := bufpool.Get(int(we - w))
		buf := (*b)[:we-w]
		err := f.pread(buf, w)
		n := copy(p, buf[off-w:])
		bufpool.Put(b)
		if err != nil {
			return err
		}
		p, off = p[n:], off+int64(n)
	}
	return nil
}

func (f *File) bounceWrite(p []byte, off int64, dsync bool) error {
	for len(p) > 0 {
		w, we := f.window(off, off+int64(len(p)))
		n := int(min(int64(len(p)), we-off))
		b := bufpool.Get(int(we - w))
		err := f.rmw((*b)[:we-w], w, p[:n], off, dsync)
		bufpool.Put(b)
		if err != nil {
			return err
		}
		p, off = p[n:], off+int64(n)
	}
	return nil
}

// rmw writes data at off through buf, the aligned window [w, w+len(buf)) around it. The blocks at
// the window's ends that data covers only partly are read first, under a lock on those blocks, so
// that concurrent writes to other parts of the same block are not lost. Aligned writes take no
// lock: one that overlaps this write's block may land in either order, as overlapping writes may
// on any disk.
func (f *File) rmw(buf []byte, w int64, data []byte, off int64, dsync bool) error {
	we := w + int64(len(buf))
	head := off > w
	tail := off+int64(len(data)) < we
	if head || tail {
		first, last := w/dioAlign, (we-1)/dioAlign
		unlock := f.rmwLocks.Lock(first, last)
		defer unlock()
		if head {
			if err := f.pread(buf[:min(dioAlign, len(buf))], w); err != nil {
				return err
			}
		}
		if tb := last * dioAlign; tail && (!head || tb != w) {
			if err := f.pread(buf[tb-w:], tb); err != nil {
				return err
			}
		}
	}
	copy(buf[off-w:], data)
	return f.pwrite(buf, w, dsync)
}
