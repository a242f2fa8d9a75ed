package cache

import (
	"errors"
	"fmt"
	"strings"

	"github.com/tierblk/tierblk/internal/congestion"
	"github.com/tierblk/tierblk/internal/meta"
	"github.com/tierblk/tierblk/pkg/backend"
)

// DefaultCongestion is the SSD tier's congestion threshold unless the config sets one
// (Config.Congestion): below it the tier's device is never judged congested, whatever the backend.
const DefaultCongestion = congestion.DefaultThreshold

// ssdReserve is how many SSD slots stay out of the policy's capacity, so that evicted slots can
// wait for a checkpoint before reuse without stalling fills: 1/64 of the tier, up to 4096, but on
// a small tier 1/8 of it, up to 256. A checkpoint frees at most the reserve, and a flush of the SSD
// comes with each: with only 1/64 of a small tier, a burst through it spends its time in
// checkpoints (bench writeback's burst row).
func ssdReserve(slots int) int { return max(1, min(max(slots/64, min(slots/8, 256)), 4096)) }

// openSSD opens the SSD tier of cfg: it builds the tier and its journal, checks the store's
// superblock against this setup, loads the index the last run left (the tier is warm), starts the
// run and the tier's background work.
func (c *Cache) openSSD(cfg Config) error {
	slots := int(cfg.SSD.Size / c.line)
	sb, ok, err := cfg.Meta.Superblock()
	if err != nil {
		return fmt.Errorf("SSD tier metadata: %w", err)
	}
	if cfg.ReductionDefault && ok && sb.Layout != layoutOf(cfg.Reduction) {
		cfg.Reduction = c.keptReduction(sb.Layout, cfg.Reduction)
	}
	t, indexed, err := c.newSSDTier(&cfg, slots)
	if err != nil {
		return err
	}
	if c.wb, err = newWriteBack(cfg.WriteBack, slots, t.st.dirtyRoomKept(c.line)); err != nil {
		return err
	}
	if c.wb.cfg.Order == OrderFlush {
		t.ep = newEpochs()
	}
	c.attachSSD(t, &cfg)
	j := c.newSSDJournal(t, &cfg, sb, indexed)
	want := meta.Superblock{Version: meta.FormatVersion, LineSize: uint32(c.line), Backend: cfg.BackendID,
		BackendSize: c.size, Slots: uint32(slots), Layout: layoutOf(cfg.Reduction)}
	c.lastRun = errNoRunLog
	switch {
	case !ok:
		sb = want
	default:
		if err := sb.Mismatch(want); err != nil {
			return fmt.Errorf("%w: %s", ErrMismatch, strings.ReplaceAll(err.Error(), "\n", "; "))
		}
		if err := c.warmSSD(j, cfg.RunLog, sb, slots); err != nil {
			return err
		}
	}
	if err := j.startRun(cfg.RunLog, sb); err != nil {
		return err
	}
	if t.dirtyLines > 0 {
		c.log.Info("SSD tier holds dirty data from the last run; it will be written back",
			"lines", t.dirtyLines, "mode", c.Mode())
	}
	c.ssd = t
	c.bg = newBackground()
	c.bg.run(j.loop)
	c.bg.run(c.destager)
	return nil
}

// keptReduction returns the reduction that keeps an existing tier in its layout, when the
// configured one (r, a default, not the user's choice) would call for another.
func (c *Cache) keptReduction(layout string, r Reduction) Reduction {
	keep := ReductionZero
	if layout == meta.LayoutPacked {
		keep = ReductionCompress
	}
	c.log.Info("SSD tier: kept in its layout; set reduction to change it (on a new tier)",
		"reduction", keep.String(), "default", r.String())
	return keep
}

// newSSDTier builds the SSD tier of cfg, of slots lines of room, with its store: the packed log if
// its reduction packs, else slots; indexed is how many lines its index holds.
func (c *Cache) newSSDTier(cfg *Config, slots int) (t *tier, indexed int, err error) {
	indexed, layout := slots, layoutOf(cfg.Reduction)
	if layout == meta.LayoutPacked {
		indexed = slots * packedSlotsPerLine
	}
	warnIndexRAM(c.log, indexed, int(c.line/blockSize), cfg.Reduction)
	spec := c.spec("ssd", cfg.SSD, ssdReserve(indexed))
	spec.slots = indexed
	spec.lines = uint64((c.size + c.line - 1) / c.line)
	spec.reduction = cfg.Reduction
	spec.size = c.size
	if t, err = newTier(spec, c.log); err != nil {
		return nil, 0, err
	}
	if layout != meta.LayoutPacked {
		t.st = &slotStore{t: t}
		return t, indexed, nil
	}
	pk, err := newPacked(t, cfg.SSDDevice, int64(slots)*c.line)
	if err != nil {
		return nil, 0, err
	}
	if cfg.Reduction == ReductionDedupe {
		pk.dd = newDedupe(dedupeMaxEntries)
	}
	t.st = pk
	return t, indexed, nil
}

// attachSSD gives tier t cfg's SSD device, and the cache's hooks that it calls.
func (c *Cache) attachSSD(t *tier, cfg *Config) {
	t.dev = cfg.SSDDevice
	t.cong = congestion.New(cfg.SSDDevice, cfg.Congestion)
	c.ssdAsync, _ = cfg.SSDDevice.(backend.AsyncReader)
	c.ssdRing, _ = cfg.SSDDevice.(backend.RingReader)
	t.doomedWake = c.wb.kick
	t.onDamage = c.damaged
	t.recheck = func(line uint64) {
		go func() {
			if !c.closed.Load() {
				c.checkLine(line)
			}
		}()
	}
}

// newSSDJournal builds the journal of tier t over cfg's store, and gives it the lost ranges that
// superblock sb holds, to keep.
func (c *Cache) newSSDJournal(t *tier, cfg *Config, sb meta.Superblock, indexed int) *journal {
	// A last run that did not close the tier (killed) may have left writes on the backend that it
	// never flushed (write-through, write-around), which the next FLUSH must make durable
	// (TestOrderWriteThroughModel's restarts): counted as a change for the first checkpoint to
	// flush, rather than flushed here, where a backend down or slow to answer would hold up the
	// start. A close's last checkpoint flushed the backend.
	if sb.Open {
		c.backendChanges.Store(1)
	}
	j := newJournal(t, cfg.Meta, ssdReserve(indexed), c.b.Flush, c.backendChanges.Load)
	c.lost.load(sb.Lost)
	c.lost.persist = func(rs []meta.Range) error {
		return j.updateSuperblock(func(sb *meta.Superblock) { sb.Lost = rs })
	}
	return j
}

// warmSSD loads the index that the tier's last run left, superblock sb, with the records its run
// log at runLog holds since its last checkpoint, and commits those before anything is served.
func (c *Cache) warmSSD(j *journal, runLog string, sb meta.Superblock, slots int) error {
	t := j.t
	logged, found, err := j.readRunLog(runLog, sb)
	switch {
	case err != nil:
		c.lastRun = err
		c.log.Warn("the run log of the SSD tier's last run cannot be used: if that run was killed, the index records it wrote since its last checkpoint are lost",
			"err", err)
	case found:
		c.lastRun = nil
	}
	if err := j.load(logged); errors.Is(err, errRunLogRecord) {
		return fmt.Errorf("SSD tier: %w. Delete %s to start without it (the writes the last run acknowledged since its last checkpoint are lost)", err, runLog)
	} else if err != nil {
		return fmt.Errorf("SSD tier: %w", err)
	}
	j.settleSums()
	if sb.Open {
		// The last run did not close the tier: its dirty blocks of a tier of slots, and those
		// of a packed tier in mutable units, may hold other bytes than their records'
		// checksums, written in place since their last record (sum.go, "Adopted blocks").
		t.mu.Lock()
		t.adoptDirtyLocked()
		t.mu.Unlock()
	}
	if err := c.loadGhosts(t); err != nil {
		return err
	}
	if len(logged) > 0 {
		// Committed before anything is served, and before the epoch moves on (startRun): a
		// kill in between replays the same log again.
		if backendErr, tierErr := j.checkpoint(); tierErr != nil || backendErr != nil {
			return fmt.Errorf("SSD tier: committing the records of the run log: %w", errors.Join(tierErr, backendErr))
		}
		c.log.Info("SSD tier: replayed the last run's log", "lines", len(logged), "log", runLog)
	}
	c.log.Info("SSD tier warm", "lines", t.index.Len(), "slots", slots)
	return nil
}
