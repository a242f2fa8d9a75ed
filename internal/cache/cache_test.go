package cache

import (
	"fmt"
	"testing"

	"github.com/tierblk/tierblk/internal/meta"
	"github.com/tierblk/tierblk/pkg/backend"
	"github.com/tierblk/tierblk/pkg/backend/backendtest"
	"github.com/tierblk/tierblk/pkg/backend/mem"
)

// layout is one shape of cache the tests run.
type layout struct {
	name     string
	line     int64
	ram, ssd int64 // lines
	mode     Mode
	policy   string
	// admission of both tiers; empty for the default (whose first epoch of lookups, longer than
	// most tests, admits every miss)
	admission string
	runLog    string // the SSD tier's run log (Config.RunLog)
	reduction Reduction
	// dedupeHash stands for the content hash of a tier with reduction dedupe (weakHash: collisions)
	dedupeHash func([]byte) uint64
	order      string // write-back's order (WriteBackConfig.Order); empty for the default
}

var layouts = []layout{
	{name: "ram-only", line: 64 << 10, ram: 8},
	{name: "ssd-only", line: 64 << 10, ssd: 8},
	{name: "ram+ssd", line: 64 << 10, ram: 4, ssd: 16},
	{name: "ram+ssd-4k-lines", line: 4 << 10, ram: 16, ssd: 64, policy: "s3fifo"},
	{name: "ram+ssd-1m-lines", line: 1 << 20, ram: 2, ssd: 4, policy: "arc"},
	{name: "writearound", line: 64 << 10, ram: 4, ssd: 16, mode: WriteAround},
	{name: "passthrough", line: 64 << 10, ram: 4, ssd: 16, mode: PassThrough},
	{name: "writeback", line: 64 << 10, ram: 4, ssd: 16, mode: WriteBack},
	{name: "writeback-4k-lines", line: 4 << 10, ram: 8, ssd: 64, mode: WriteBack, policy: "s3fifo"},
	{name: "writeback-ssd-only", line: 64 << 10, ssd: 8, mode: WriteBack},
}

// newCache builds a cache of layout l over b, with an SSD on RAM and metadata in memory.
func newCache(t testing.TB, b backend.Backend, l layout, store meta.Store, ssdDev backend.Backend) *Cache {
	t.Helper()
	c, err := New(b, testConfig(l, store, ssdDev))
	if err != nil {
		t.Fatal(err)
	}
	if l.dedupeHash != nil {
		packedOf(c.ssd).dd.Hash = l.dedupeHash // before any write
	}
	return c
}

// testConfig is the configuration of a cache of layout l (store and ssdDev: nil for new ones in
// memory).
func testConfig(l layout, store meta.Store, ssdDev backend.Backend) Config {
	// No throttle delays: with tiers of a few lines, dirty data is always near its maximum, and
	// the delays would only slow the tests (writes still wait at the maximum).
	cfg := Config{LineSize: l.line, Mode: l.mode, BackendID: "test", WriteBack: WriteBackConfig{Throttle: "none", Order: l.order}, RunLog: l.runLog,
		Reduction: l.reduction,
		RAM:       TierConfig{Size: l.ram * l.line, Policy: l.policy, Admission: l.admission},
		SSD:       TierConfig{Size: l.ssd * l.line, Policy: l.policy, Admission: l.admission}}
	if l.ssd > 0 {
		if ssdDev == nil {
			ssdDev = mem.New(l.ssd * l.line)
		}
		if store == nil {
			store = meta.NewMem()
		}
		cfg.SSDDevice, cfg.Meta = ssdDev, store
	}
	return cfg
}

func TestConformance(t *testing.T) {
	for _, l := range layouts {
		t.Run(l.name, func(t *testing.T) {
			backendtest.Run(t, func(t *testing.T, size int64) backend.Backend {
				c := newCache(t, mem.New(size), l, nil, nil)
				t.Cleanup(func() { c.Close() })
				return c
			})
		})
	}
}

func TestHitsAfterMiss(t *testing.T) {
	for _, l := range layouts[:3] {
		t.Run(l.name, func(t *testing.T) {
			b := mem.New(1 << 20)
			want := backendtest.Pattern(1, 1<<20)
			b.WriteAt(want, 0)
			c := newCache(t, b, l, nil, nil)
			defer c.Close()
			got := make([]byte, 4096)
			for range 3 {
				if _, err := c.ReadAt(got, 8192); err != nil {
					t.Fatal(err)
				}
			}
			if string(got) != string(want[8192:8192+4096]) {
				t.Fatal("wrong data")
			}
			st := c.Stats()
			if st.Backend.Reads != 1 {
				t.Fatalf("backend reads = %d, want 1 (one miss, then hits): %+v", st.Backend.Reads, st)
			}
			var hits uint64
			for _, tr := range st.Tiers {
				hits += tr.Hits
			}
			if hits != 2 {
				t.Fatalf("hits = %d, want 2: %+v", hits, st.Tiers)
			}
		})
	}
}

func TestSSDReserve(t *testing.T) {
	for _, c := range []struct{ slots, want int }{
		{1, 1},          // never none: evictions need somewhere to wait
		{8, 1},          // 1/8
		{1024, 128},     // a 64 MiB tier of 64 KiB lines: 1/8
		{16384, 256},    // 1 GiB: 1/8 reaches its cap, 1/64 meets it
		{65536, 1024},   // 4 GiB: 1/64
		{1 << 20, 4096}, // 64 GiB: capped
	} {
		if got := ssdReserve(c.slots); got != c.want {
			t.Errorf("ssdReserve(%d) = %d, want %d", c.slots, got, c.want)
		}
	}
}

func ExampleMode() {
	for _, s := range []string{"writethrough", "writeback", "write-back"} {
		m, err := ParseMode(s)
		fmt.Println(m, err)
	}
	// Output:
	// writethrough <nil>
	// writeback <nil>
	// writethrough unknown cache mode "write-back"; use writethrough, writearound, passthrough or writeback
}
