// Package mem is a sparse RAM backend: mem://1GiB is a device whose memory is allocated on the
// first write to each page, so a large device costs nothing until it is written. It serves tests
// and benchmarks (the peer it is measured against is nbdkit's memory plugin), so its data path takes
// no global lock: the page table is read with atomic loads and each page has its own lock.
//
// RAM is volatile by nature: Flush does nothing and promises nothing beyond the process's life. This
// backend must never be used where data has to survive a restart.
package mem

import (
	"fmt"
	"net/url"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/tierblk/tierblk/internal/units"
	"github.com/tierblk/tierblk/pkg/backend"
)

const (
	pageShift = 16 // 64 KiB pages: one allocation covers sixteen 4 KiB blocks
	pageSize  = 1 << pageShift
	// A leaf table maps 4096 pages (256 MiB); leaves are allocated on demand too, so the fixed cost
	// of a device is one pointer per 256 MiB (32 KiB for 1 TiB).
	leafShift = 12
	leafPages = 1 << leafShift

	// MaxSize bounds the device so that the top-level table stays small (32 MiB at 1 PiB).
	MaxSize = 1 << 50
)

// page is one allocated piece of the device. The lock makes a read or write within the page atomic
// with respect to other requests on the same page, as a sector is on a disk.
type page struct {
	mu   sync.RWMutex
	data [pageSize]byte
}

type leaf [leafPages]atomic.Pointer[page]

// Mem is a sparse in-memory backend. It implements backend.Trimmer, backend.ZeroWriter and
// backend.ReadOnlyReporter.
type Mem struct {
	size     int64
	readOnly bool
	closed   atomic.Bool
	top      []atomic.Pointer[leaf]
}

// New returns a writable device of size bytes, all zeroes. It panics if size is not in (0, MaxSize]:
// it is meant for tests, where the size is a constant.
func New(size int64) *Mem {
	if size <= 0 || size > MaxSize {
		panic(fmt.Sprintf("mem: size %d out of range (1..%d)", size, int64(MaxSize)))
	}
	pages := (size + pageSize - 1) >> pageShift
	return &Mem{size: size, top: make([]atomic.Pointer[leaf], (pages+leafPages-1)>>leafShift)}
}

var validParams = []string{"size"}

// Open is the backend.Factory for mem://SIZE (for example mem://1GiB) and mem:///?size=SIZE.
func Open(u *url.URL, opts backend.Options) (backend.Backend, error) {
	size, err := parseURL(u)
	if err != nil {
		return nil, backend.BadURL(err)
	}
	m := New(size)
	m.readOnly = opts.ReadOnly
	return m, nil
}

func parseURL(u *url.URL) (int64, error) {
	if u.Scheme != "mem" {
		return 0, fmt.Errorf("mem backend: scheme %q is not mem", u.Scheme)
	}
	if u.Opaque != "" || u.User != nil || (u.Path != "" && u.Path != "/") || u.Fragment != "" {
		return 0, fmt.Errorf("mem backend: malformed URL; write mem://SIZE, for example mem://1GiB")
	}
	q := u.Query()
	var unknown []string
	for k := range q {
		if k != "size" {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return 0, fmt.Errorf("mem backend: unknown parameter %s; valid: %s",
			strings.Join(unknown, ", "), strings.Join(validParams, ", "))
	}
	sizeText := u.Host
	switch {
	case len(q["size"]) > 1:
		return 0, fmt.Errorf("mem backend: size given %d times", len(q["size"]))
	case sizeText != "" && q.Has("size"):
		return 0, fmt.Errorf("mem backend: size given both as host (%q) and as ?size=; give it once", sizeText)
	case q.Has("size"):
		sizeText = q.Get("size")
	case sizeText == "":
		return 0, fmt.Errorf("mem backend: no size; write mem://SIZE, for example mem://1GiB")
	}
	size, err := units.ParseSize(sizeText)
	if err != nil {
		return 0, fmt.Errorf("mem backend: %w", err)
	}
	if size <= 0 || size > MaxSize {
		return 0, fmt.Errorf("mem backend: size %s must be between 1 byte and %s",
			sizeText, units.FormatSize(MaxSize))
	}
	return size, nil
}

// Size implements backend.Backend.
func (m *Mem) Size() int64 { return m.size }

// ReadOnly implements backend.ReadOnlyReporter.
func (m *Mem) ReadOnly() bool { return m.readOnly }

func (m *Mem) check(off, length int64, write bool) error {
	if m.closed.Load() {
		return backend.ErrClosed
	}
	if write && m.readOnly {
		return backend.ErrReadOnly
	}
	return backend.CheckRange(off, length, m.size)
}

// lookup returns page i, or nil if it was never written.
func (m *Mem) lookup(i int64) *page {
	l := m.top[i>>leafShift].Load()
	if l == nil {
		return nil
	}
	return l[i&(leafPages-1)].Load()
}

// alloc returns page i, allocating it (and its leaf) if needed. Concurrent allocators agree on one
// page through compare-and-swap; the loser's allocation is garbage.
func (m *Mem) alloc(i int64) *page {
	slot := &m.top[i>>leafShift]
	l := slot.Load()
	if l == nil {
		slot.CompareAndSwap(nil, new(leaf))
		l = slot.Load()
	}
	ps := &l[i&(leafPages-1)]
	p := ps.Load()
	if p == nil {
		ps.CompareAndSwap(nil, new(page))
		p = ps.Load()
	}
	return p
}

// span calls fn for each page that [off, off+length) touches, with the page index and the range
// [lo, hi) within the page; pos is how far into the request the piece starts.
func span(off, length int64, fn func(i int64, lo, hi int, pos int64)) {
	for pos := int64(0); pos < length; {
		at := off + pos
		lo := int(at & (pageSize - 1))
		hi := int(min(pageSize, int64(lo)+length-pos))
		fn(at>>pageShift, lo, hi, pos)
		pos += int64(hi - lo)
	}
}

// ReadAt implements backend.Backend. Pages never written read as zeroes.
func (m *Mem) ReadAt(p []byte, off int64) (int, error) {
	if err := m.check(off, int64(len(p)), false); err != nil {
		return 0, err
	}
	span(off, int64(len(p)), func(i int64, lo, hi int, pos int64) {
		dst := p[pos : pos+int64(hi-lo)]
		pg := m.lookup(i)
		if pg == nil {
			clear(dst)
			return
		}
		pg.mu.RLock()
		copy(dst, pg.data[lo:hi])
		pg.mu.RUnlock()
	})
	return len(p), nil
}

// WriteAt implements backend.Backend.
func (m *Mem) WriteAt(p []byte, off int64) (int, error) {
	if err := m.check(off, int64(len(p)), true); err != nil {
		return 0, err
	}
	span(off, int64(len(p)), func(i int64, lo, hi int, pos int64) {
		pg := m.alloc(i)
		pg.mu.Lock()
		copy(pg.data[lo:hi], p[pos:])
		pg.mu.Unlock()
	})
	return len(p), nil
}

// Flush implements backend.Backend. It does nothing: there is nothing more durable than the RAM the
// data already sits in.
func (m *Mem) Flush() error {
	if m.closed.Load() {
		return backend.ErrClosed
	}
	return nil
}

// Trim implements backend.Trimmer: whole pages are freed, partial ones zeroed.
func (m *Mem) Trim(off, length int64) error {
	return m.WriteZeroes(off, length, true)
}

// WriteZeroes implements backend.ZeroWriter. Pages never written are zero already and stay
// unallocated, so zeroing a large device costs no memory. With mayUnmap, pages and leaf tables
// wholly inside the range are freed; without it they stay allocated and are zeroed in place.
func (m *Mem) WriteZeroes(off, length int64, mayUnmap bool) error {
	if err := m.check(off, length, true); err != nil {
		return err
	}
	const leafBytes = pageSize * leafPages
	for pos, end := off, off+length; pos < end; {
		li := pos / leafBytes
		next := min((li+1)*leafBytes, end)
		switch l := m.top[li].Load(); {
		case l == nil:
		case mayUnmap && next-pos == leafBytes:
			m.top[li].Store(nil)
		default:
			span(pos, next-pos, func(i int64, lo, hi int, _ int64) { zeroPage(l, i, lo, hi, mayUnmap) })
		}
		pos = next
	}
	return nil
}

// zeroPage zeroes [lo, hi) of page i, which leaf l holds.
func zeroPage(l *leaf, i int64, lo, hi int, mayUnmap bool) {
	slot := &l[i&(leafPages-1)]
	if mayUnmap && lo == 0 && hi == pageSize {
		slot.Store(nil)
		return
	}
	if pg := slot.Load(); pg != nil {
		pg.mu.Lock()
		clear(pg.data[lo:hi])
		pg.mu.Unlock()
	}
}

// Close implements backend.Backend: it frees the memory, and later calls fail with ErrClosed.
func (m *Mem) Close() error {
	if m.closed.Swap(true) {
		return backend.ErrClosed
	}
	for i := range m.top {
		m.top[i].Store(nil)
	}
	return nil
}

// Allocated returns how many bytes of pages are allocated, for tests and reports.
func (m *Mem) Allocated() int64 {
	var n int64
	for i := range m.top {
		l := m.top[i].Load()
		if l == nil {
			continue
		}
		for j := range l {
			if l[j].Load() != nil {
				n += pageSize
			}
		}
	}
	return n
}
