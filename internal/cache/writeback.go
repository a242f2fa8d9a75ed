package cache

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tierblk/tierblk/internal/policy"
	"github.com/tierblk/tierblk/internal/ratemeter"
)

// WriteBackConfig tunes write-back. Ratios are of the SSD tier's lines.
type WriteBackConfig struct {
	// Destage starts above High and stops below Low; it also runs when the backend has been idle
	// for a second. Writes wait rather than let dirty lines pass Max.
	High, Low, Max float64
	// Destage and Throttle name the policies (policy.DestageNames, policy.ThrottleNames).
	Destage, Throttle string
	// Order is the order dirty data reaches the backend in: OrderAddress or OrderFlush.
	Order string
}

// The orders write-back destages in (WriteBackConfig.Order).
const (
	// OrderAddress writes dirty data back in backend-address order, coalesced across FLUSHes:
	// while dirty data remains, the backend alone may hold a state no crash could have left.
	OrderAddress = "address"
	// OrderFlush writes back the writes between two FLUSHes (an epoch) only after every earlier
	// epoch is on the backend, flushed: the backend alone is always a state a crash of the
	// device could have left, only older (docs/architecture.md, "Write-back in FLUSH order").
	OrderFlush = "flush"
)

// DefaultWriteBack is the write-back tuning unless configured otherwise.
var DefaultWriteBack = WriteBackConfig{High: 0.5, Low: 0.25, Max: 0.9, Destage: "watermark", Throttle: "proportional", Order: OrderFlush}

// fill takes the defaults for what is not given: the watermarks where none is (a configuration
// that gives any takes its zeros as given, for validate to judge: low 0 destages until nothing is
// dirty), the policies where unnamed.
func (w *WriteBackConfig) fill() {
	d := DefaultWriteBack
	if w.High == 0 && w.Low == 0 && w.Max == 0 {
		w.High, w.Low, w.Max = d.High, d.Low, d.Max
	}
	if w.Destage == "" {
		w.Destage = d.Destage
	}
	if w.Throttle == "" {
		w.Throttle = d.Throttle
	}
	if w.Order == "" {
		w.Order = d.Order
	}
}

func (w WriteBackConfig) watermarks() policy.Watermarks {
	return policy.Watermarks{High: w.High, Low: w.Low, Max: w.Max}
}

func (w WriteBackConfig) validate() error {
	if !(0 <= w.Low && w.Low < w.High && w.High <= w.Max && w.Max <= 1) {
		return fmt.Errorf("write-back watermarks low %.2f, high %.2f, max %.2f: need 0 <= low < high <= max <= 1", w.Low, w.High, w.Max)
	}
	if w.Order != OrderAddress && w.Order != OrderFlush {
		return fmt.Errorf("write-back order %q: need %q or %q", w.Order, OrderAddress, OrderFlush)
	}
	return nil
}

// writeBack is the write-back machinery of a cache with an SSD tier.
type writeBack struct {
	cfg      WriteBackConfig
	destage  policy.Destage
	throttle policy.Throttle
	lines    int // the SSD tier's lines of room: what the dirty ratio is of
	maxLines int

	// modeMu orders mode switches against write-back writes: those hold it shared from their
	// last look at the mode until their lines are dirty (taking their line locks under it),
	// SetMode alone to switch. It guards no field: the mode is the cache's atomic.
	modeMu sync.RWMutex

	// mu guards reserved, queue, next and closed. It is taken before any line lock (admitDirty)
	// or with none, and nothing is taken under it. cond (L is mu) wakes the writes waiting in
	// admitDirty for room: broadcast when room may have come (wake, releaseDirty, a write leaving
	// the queue) and at Close.
	mu       sync.Mutex
	cond     *sync.Cond
	reserved int // lines that writes in flight may dirty, counted against maxLines
	// queue holds the tickets of the writes waiting in admitDirty (waitTurn), in the order they came (next is the
	// next ticket): room goes to the first, so that a large write is not passed for ever by the
	// small ones that fit in each line the destager frees (a request held past the kernel NBD
	// client's 30 s timeout, or the hung-task detector's 20 s).
	queue   []uint64
	next    uint64
	waiting atomic.Int32
	closed  bool

	lastIO    atomic.Int64 // unix nanoseconds of the last client request
	running   atomic.Bool
	blockTime atomic.Int64 // nanoseconds per block destaged, moving average
	kickCh    chan struct{}

	destagedBytes, destageWrites, destageErrors atomic.Uint64
	destaged                                    ratemeter.Meter // of destagedBytes
	throttled                                   atomic.Uint64
	throttleNs                                  atomic.Int64
	// backendWaits counts the retries of writes waiting for a failing backend (retryBackend)
	backendWaits atomic.Uint64
	// ghosts counts the older versions of dirty blocks kept for writes over them (ghost.go)
	ghosts atomic.Uint64
}

// newWriteBack is the write-back machinery of an SSD tier with room for lines lines, of which it
// keeps keep from dirty data (a packed tier's room for reclaim, pack_seg.go: dirtyRoomKept).
func newWriteBack(cfg WriteBackConfig, lines, keep int) (*writeBack, error) {
	cfg.fill()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	w := &writeBack{cfg: cfg, lines: lines, maxLines: max(1, min(int(cfg.Max*float64(lines)), lines-keep)),
		kickCh: make(chan struct{}, 1)}
	var err error
	if w.destage, err = policy.NewDestage(cfg.Destage); err != nil {
		return nil, err
	}
	if w.throttle, err = policy.NewThrottle(cfg.Throttle); err != nil {
		return nil, err
	}
	w.cond = sync.NewCond(&w.mu)
	w.blockTime.Store(int64(100 * time.Microsecond))
	return w, nil
}

// wake tells writes waiting for room to look again. Dirty lines drop without w.mu, so it
// broadcasts holding w.mu: a write that found no room is then inside cond.Wait, never between its
// check and Wait, where a bare Broadcast would be lost and it would wait for good.
func (w *writeBack) wake() {
	w.mu.Lock()
	w.cond.Broadcast()
	w.mu.Unlock()
}

func (w *writeBack) kick() {
	select {
	case w.kickCh <- struct{}{}:
	default:
	}
}

// Mode returns the cache's mode.
func (c *Cache) Mode() Mode { return Mode(c.mode.Load()) }

func (c *Cache) ratio() float64 {
	return float64(c.ssd.dirtyCount.Load()) / float64(c.wb.lines)
}

// admitDirty throttles a write-back write that may dirty n lines, blocks blocks of them, then
// reserves room for the lines below the maximum, waiting for the destager if there is none: writes
// never fail for lack of space, and dirty lines never pass the maximum. releaseDirty(n) gives the
// reservation back.
func (c *Cache) admitDirty(n, blocks int) error {
	w := c.wb
	if d := c.throttleDelay(blocks); d > 0 {
		w.throttled.Add(1)
		w.throttleNs.Add(int64(d))
		time.Sleep(d)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	// fits: room for n more lines, or a request larger than the whole allowance with none
	// reserved, which goes through alone. A tier bypassed meanwhile takes no more dirty data: the
	// write goes through (write); the destager wakes waiting writes after each attempt, failed or
	// not.
	room := func() bool {
		return int(c.ssd.dirtyCount.Load())+w.reserved+n <= w.maxLines || (w.reserved == 0 && n > w.maxLines)
	}
	// In FLUSH order a write back halted by a lost block (epoch.go) makes no more room.
	halted := func() bool { return c.ssd.ep != nil && c.ssd.ep.halted.Load() }
	fits := func() bool { return room() || w.closed || !c.ssd.usable() || halted() }
	if len(w.queue) > 0 || !fits() {
		w.waitTurn(fits)
	}
	if w.closed {
		return errors.New("cache: closed while waiting for room for dirty data")
	}
	if !room() && halted() && c.ssd.usable() {
		return c.ssd.ep.haltedErr()
	}
	w.reserved += n
	return nil
}

// waitTurn queues a write that found no room, or others waiting before it, and waits until it is
// the first and fits. The caller holds w.mu.
func (w *writeBack) waitTurn(fits func() bool) {
	ticket := w.next
	w.next++
	w.queue = append(w.queue, ticket)
	for w.queue[0] != ticket || !fits() {
		w.waiting.Add(1)
		w.kick()
		w.cond.Wait()
		w.waiting.Add(-1)
	}
	// Out of the queue: the next may be first now.
	w.queue = w.queue[1:]
	w.cond.Broadcast()
}

// releaseDirty gives back the room admitDirty(n) reserved.
func (c *Cache) releaseDirty(n int) {
	w := c.wb
	w.mu.Lock()
	w.reserved -= n
	w.mu.Unlock()
	w.cond.Broadcast()
}

// throttleDelay is the delay the throttle policy gives a write that dirties blocks blocks now:
// the destager's time for the blocks the write gives it, not for whole lines, or small random
// writes would each be held for the time their lines' other blocks would take.
func (c *Cache) throttleDelay(blocks int) time.Duration {
	w := c.wb
	return w.throttle.Delay(policy.ThrottleState{Ratio: c.ratio(), BlockTime: time.Duration(w.blockTime.Load()),
		Blocks: blocks, Watermarks: w.cfg.watermarks()})
}
