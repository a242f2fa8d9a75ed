package cache

import (
	"bytes"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/congestion"
	"github.com/tierblk/tierblk/internal/meta"
	"github.com/tierblk/tierblk/pkg/backend"
	"github.com/tierblk/tierblk/pkg/backend/mem"
)

// TestMissCounters runs a known workload and checks the read amplification and admission counters:
// scattered 4 KiB reads fetch their own bytes; a sequential reader fetches its first block, then
// the rest of the line; with nhit:2 a line is turned away on its first miss and taken on its second.
func TestMissCounters(t *testing.T) {
	const line = 64 << 10
	c, err := New(mem.New(64*line), Config{LineSize: line, BackendID: "test",
		RAM: TierConfig{Size: 16 * line, Admission: "nhit:2"}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 4096)
	read := func(off int64) {
		t.Helper()
		if _, err := c.ReadAt(buf, off); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 8 { // one block in each of 8 lines: each turned away, fetched as asked
		read(int64(i)*line + 8192)
	}
	for i := range 8 { // another block of the same lines: each taken, its block fetched
		read(int64(i)*line + 3*8192)
	}
	s := c.Stats()
	if s.ReadBytes != 16*4096 || s.FetchedBytes != 16*4096 {
		t.Fatalf("scattered reads: %d bytes asked, %d fetched; want %d each", s.ReadBytes, s.FetchedBytes, 16*4096)
	}
	if r := s.Tiers[0]; r.Rejected != 8 || r.Admitted != 8 || r.Lines != 8 {
		t.Fatalf("scattered reads: %d rejected, %d admitted, %d lines; want 8 each", r.Rejected, r.Admitted, r.Lines)
	}
	// A sequential reader over line 20: its first read is turned away and fetched as asked, its
	// second continues it, is taken and fetches the rest of the line; the other 14 reads hit.
	for off := int64(20 * line); off < 21*line; off += 4096 {
		read(off)
	}
	s = c.Stats()
	if want := uint64(16*4096 + line); s.FetchedBytes != want {
		t.Fatalf("after a sequential line: %d bytes fetched, want %d", s.FetchedBytes, want)
	}
	if h := s.Tiers[0].Hits; h != 14 {
		t.Fatalf("after a sequential line: %d hits, want 14", h)
	}
}

// TestSSDAdmissionAuto runs the default admission (policy.Auto) of an SSD tier through a cold random
// workload and then a reused set, and checks its counters: the first epoch of misses is admitted
// (a cache starts out paying), the rest of the cold misses are turned away, and lines missed a
// second time are admitted and then hit.
func TestSSDAdmissionAuto(t *testing.T) {
	const line, lines = 4 << 10, 16384
	c, err := New(mem.New(lines*line), Config{LineSize: line, BackendID: "test",
		SSD:       TierConfig{Size: 64 * line},
		SSDDevice: mem.New(64 * line), Meta: meta.NewMem()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, line)
	read := func(l int) {
		t.Helper()
		if _, err := c.ReadAt(buf, int64(l)*line); err != nil {
			t.Fatal(err)
		}
	}
	const epoch, cold = 4096, 3 * 4096
	scatter := func(i int) int { return i * 7919 % lines } // distinct lines, none next to the last
	for i := range cold {
		read(scatter(i))
	}
	ssd := c.Stats().Tiers[0]
	if ssd.Admission != DefaultAdmission {
		t.Fatalf("SSD admission %q, want the default %q", ssd.Admission, DefaultAdmission)
	}
	if ssd.Admitted != epoch || ssd.Rejected != cold-epoch {
		t.Fatalf("cold reads: SSD admitted %d and rejected %d; want %d and %d", ssd.Admitted, ssd.Rejected, epoch, cold-epoch)
	}
	// A few of the lines turned away, read again: a second miss each, admitted; then hits.
	const reused = 4
	for i := range reused {
		read(scatter(cold - 1 - i))
	}
	if ssd = c.Stats().Tiers[0]; ssd.Admitted != epoch+reused {
		t.Fatalf("second misses: SSD admitted %d, want %d", ssd.Admitted, epoch+reused)
	}
	for i := range reused {
		read(scatter(cold - 1 - i))
	}
	if ssd = c.Stats().Tiers[0]; ssd.Hits != reused {
		t.Fatalf("third reads: %d SSD hits, want %d", ssd.Hits, reused)
	}
}

// timedDevice stands in for a block device the kernel times (backend.DeviceTimer): each request
// adds latency to its counters. Fault injection: a real congested device is in the VM test
// (integration/vm/guest/congestion.sh).
type timedDevice struct {
	backend.Backend
	latency atomic.Int64 // ns a request takes
	mu      sync.Mutex
	t       backend.DeviceTime
}

func (d *timedDevice) count(write bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if write {
		d.t.Writes++
		d.t.WriteTime += time.Duration(d.latency.Load())
	} else {
		d.t.Reads++
		d.t.ReadTime += time.Duration(d.latency.Load())
	}
}

func (d *timedDevice) ReadAt(p []byte, off int64) (int, error) {
	d.count(false)
	return d.Backend.ReadAt(p, off)
}

func (d *timedDevice) WriteAt(p []byte, off int64) (int, error) {
	d.count(true)
	return d.Backend.WriteAt(p, off)
}

func (d *timedDevice) DeviceTime() (backend.DeviceTime, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.t, nil
}

// slowReads delays every read of a backend.
type slowReads struct {
	backend.Backend
	delay time.Duration
}

func (s *slowReads) ReadAt(p []byte, off int64) (int, error) {
	time.Sleep(s.delay)
	return s.Backend.ReadAt(p, off)
}

// TestCongestedSSD: an SSD tier whose device takes longer a request than the threshold and than
// the backend's reads admits no missed line but for probes, serves every read all the same, and
// admits again once its device is fast; a slower backend, or a threshold of -1, keeps it admitting.
func TestCongestedSSD(t *testing.T) {
	const line, lines = 4 << 10, 16384
	want := make([]byte, lines*line)
	for i := range want {
		want[i] = byte(i*7 + i/line)
	}
	back := func() backend.Backend { // the cache owns its backend: each gets its own
		b := mem.New(lines * line)
		if _, err := b.WriteAt(want, 0); err != nil {
			t.Fatal(err)
		}
		return b
	}
	open := func(t *testing.T, b backend.Backend, threshold time.Duration, latency time.Duration) (*Cache, *timedDevice) {
		t.Helper()
		dev := &timedDevice{Backend: mem.New(2048 * line)}
		dev.latency.Store(int64(latency))
		c, err := New(b, Config{LineSize: line, BackendID: "test", SSD: TierConfig{Size: 2048 * line, Admission: "always"},
			SSDDevice: dev, Meta: meta.NewMem(), Congestion: threshold})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if c.ssd.cong != nil {
			c.ssd.cong.SetInterval(0) // judge at every miss
		}
		return c, dev
	}
	next := 0
	read := func(t *testing.T, c *Cache, n int) TierStats {
		t.Helper()
		before := c.Stats().Tiers[0]
		buf := make([]byte, line)
		for range n {
			off := int64(next*7919%lines) * line // never sequential
			next++
			if _, err := c.ReadAt(buf, off); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(buf, want[off:off+line]) {
				t.Fatalf("read at %d: wrong data", off)
			}
		}
		after := c.Stats().Tiers[0]
		after.Admitted -= before.Admitted
		after.Rejected -= before.Rejected
		after.Congested -= before.Congested
		return after
	}
	t.Run("slow device", func(t *testing.T) {
		c, dev := open(t, back(), 0, 30*time.Millisecond)
		s := read(t, c, 200)
		if !s.CongestedNow || s.Congested < 190 || s.Admitted+s.Rejected != 200 || s.Admitted > 10 {
			t.Fatalf("a 30 ms device: %d admitted, %d rejected (%d for congestion), congested now %v; want nearly all refused",
				s.Admitted, s.Rejected, s.Congested, s.CongestedNow)
		}
		if s.DeviceLatency != 0.03 {
			t.Fatalf("device latency %g s, want 0.03", s.DeviceLatency)
		}
		// A write-through write of a new line is no miss: it is still stored.
		held := c.Stats().Tiers[0].Lines
		last := int64(lines-1) * line // no read above touched it
		if _, err := c.WriteAt(want[last:last+line], last); err != nil {
			t.Fatal(err)
		}
		if got := c.Stats().Tiers[0].Lines; got != held+1 {
			t.Fatalf("a write while congested: %d lines, want %d", got, held+1)
		}
		dev.latency.Store(int64(100 * time.Microsecond))
		read(t, c, 2*congestion.ProbeEvery) // a probe's fill is timed fast
		if s := read(t, c, 50); s.CongestedNow || s.Congested != 0 || s.Admitted != 50 {
			t.Fatalf("a fast device again: %d admitted, %d refused for congestion, congested now %v; want all 50 admitted",
				s.Admitted, s.Congested, s.CongestedNow)
		}
	})
	t.Run("slower backend", func(t *testing.T) {
		c, _ := open(t, &slowReads{Backend: back(), delay: 5 * time.Millisecond}, 0, 3*time.Millisecond)
		if s := read(t, c, 30); s.Congested != 0 || s.Admitted != 30 || s.DeviceLatency != 0.003 {
			t.Fatalf("a 3 ms device before a backend slower still: %d admitted, %d refused for congestion, device %g s; want all admitted",
				s.Admitted, s.Congested, s.DeviceLatency)
		}
	})
	t.Run("off", func(t *testing.T) {
		c, _ := open(t, back(), -1, 30*time.Millisecond)
		if s := read(t, c, 30); s.Congested != 0 || s.Admitted != 30 || s.DeviceLatency != 0 {
			t.Fatalf("congestion off: %d admitted, %d refused for congestion, device %g s; want all admitted, no figure",
				s.Admitted, s.Congested, s.DeviceLatency)
		}
	})
}

// intoBackend records, for each read, whether it was made into the buffer into (in place).
type intoBackend struct {
	backend.Backend
	mu     sync.Mutex
	into   []byte
	direct []bool
}

func (b *intoBackend) ReadAt(p []byte, off int64) (int, error) {
	b.mu.Lock()
	b.direct = append(b.direct, len(p) > 0 && len(b.into) > 0 &&
		&p[0] == &b.into[int(off)%len(b.into)]) // the tests read at offsets where p starts at into's off%len
	b.mu.Unlock()
	return b.Backend.ReadAt(p, off)
}

// TestMissInPlace: a miss that fetches exactly the bytes asked reads them into the caller's buffer
// (no copy to serve them), whether a tier takes them or not, and the tier filled from them holds
// the right data; one that fetches more (a partial block for a tier) goes through a buffer of its
// own; a line's dirty blocks still replace the backend's older bytes in place.
func TestMissInPlace(t *testing.T) {
	const line = 16 << 10
	for _, tc := range []struct {
		name      string
		admission string
		off, n    int64
		direct    bool
	}{
		{"two lines, turned away", "nhit:2", 2 * line, 2 * line, true},
		{"two lines, filled", "always", 2 * line, 2 * line, true},
		{"whole blocks, filled", "always", 2*line + 4096, 8192, true},
		{"part of a block, filled", "always", 2*line + 4096 + 512, 1024, false},
		{"part of a block, turned away", "nhit:2", 2*line + 4096 + 512, 1024, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := mem.New(16 * line)
			want := bytes.Repeat([]byte("0123456789abcdef"), 16*line/16)
			for i := range want {
				want[i] ^= byte(i / 4096)
			}
			_, err := m.WriteAt(want, 0)
			require.NoError(t, err)
			b := &intoBackend{Backend: m}
			c := newCache(t, b, layout{line: line, ssd: 8, mode: WriteThrough, admission: tc.admission}, nil, nil)
			defer c.Close()
			buf := make([]byte, 16*line) // p starts at off%len(buf) in it: what intoBackend checks
			p := buf[tc.off : tc.off+tc.n]
			b.into = buf
			_, err = c.ReadAt(p, tc.off)
			require.NoError(t, err)
			require.Equal(t, want[tc.off:tc.off+tc.n], p)
			require.Equal(t, []bool{tc.direct}, b.direct, "read into the caller's buffer")

			clear(p)
			_, err = c.ReadAt(p, tc.off) // a hit where the first read filled the tier
			require.NoError(t, err)
			require.Equal(t, want[tc.off:tc.off+tc.n], p)
		})
	}
	t.Run("over dirty blocks", func(t *testing.T) {
		m := mem.New(16 * line)
		b := &intoBackend{Backend: m}
		c := newCache(t, b, layout{line: line, ssd: 8, mode: WriteBack, admission: "nhit:2", order: OrderAddress}, nil, nil)
		defer c.Close()
		dirty := bytes.Repeat([]byte{9}, 4096)
		_, err := c.WriteAt(dirty, line+4096) // a block of line 1, dirty on the SSD tier
		require.NoError(t, err)
		buf := make([]byte, 16*line)
		p := buf[0 : 3*line]
		b.into = buf
		_, err = c.ReadAt(p, 0)
		require.NoError(t, err)
		want := make([]byte, 3*line)
		copy(want[line+4096:], dirty)
		require.Equal(t, want, p)
		require.Equal(t, []bool{true}, b.direct, "read into the caller's buffer")
	})
}
