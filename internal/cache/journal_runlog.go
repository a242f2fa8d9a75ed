package cache

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/tierblk/tierblk/internal/meta"
	"github.com/tierblk/tierblk/internal/runlog"
)

// The run log (internal/runlog) holds, in order, every record the journal puts in changed, so
// that a kill of the process between two checkpoints loses none of them: the next run replays the
// log into the index and commits a checkpoint before it serves anything. Then every write the
// killed run acknowledged is found again (not only those a FLUSH covered), which lets a kernel
// block device that outlived the kill be taken over: its next FLUSH is answered truthfully.
//
// The records are the tier's own, as the journal holds them in changed: the last record of a line
// is its state in memory, which never calls a block valid before its data was written to the SSD
// (through the page cache, which outlives the process as the log does), and invalidations are
// logged when they happen, in order, so a replay cannot make older data valid again. A slot is
// reused only after a checkpoint committed the deletion of its last line's record and moved the
// log's watermark past it: a replay never reads a record of a slot's former line.
//
// The log is tied to the SSD tier's ID and to the run that wrote it (the superblock's epoch, which
// every start bumps once it has replayed the log): a log of another tier, or one older than a run
// that opened the store since, is never replayed.

// loggedLocked returns the number of the last record logged (0 without a log).
func (j *journal) loggedLocked() uint64 {
	if j.log == nil {
		return 0
	}
	return j.log.Last()
}

// readRunLog reads the run log at path, written beside the store's superblock sb, and returns the
// last record of each line it changed after its last checkpoint. found reports whether there was
// a log to read; err says why one cannot be used.
func (j *journal) readRunLog(path string, sb meta.Superblock) (logged map[uint64]meta.Op, found bool, err error) {
	if path == "" || sb.ID == "" {
		return nil, false, nil
	}
	logged = map[uint64]meta.Op{}
	sums := map[uint64][]meta.Line{}
	found, err = runlog.Replay(path, runlog.Identity{Tier: sb.ID, Epoch: sb.Epoch}, j.shape(), func(op meta.Op) error {
		logged[op.Rec.Line] = op
		if !op.Delete && op.Rec.Sum != nil {
			sums[op.Rec.Line] = append(sums[op.Rec.Line], op.Rec)
		}
		return nil
	})
	if err != nil {
		return nil, found, err
	}
	j.logSums = sums
	return logged, found, nil
}

// shape is what a run log record of the tier holds: its bitmaps' words, a location word a block
// on a packed tier, a checksum a block, and in FLUSH order an epoch a block.
func (j *journal) shape() runlog.Shape {
	s := runlog.Shape{Words: (j.t.blocks + 63) / 64, Locs: j.t.st.locWords(), Sums: j.t.blocks}
	if j.t.ep != nil {
		s.Epochs = j.t.blocks
	}
	return s
}

// startRun bumps the store's epoch (sb is what it holds, or what a new store gets) and opens a new
// run log at path under it. A log that cannot be created is logged, and the tier runs without.
func (j *journal) startRun(path string, sb meta.Superblock) error {
	if sb.ID == "" {
		var id [16]byte
		if _, err := rand.Read(id[:]); err != nil {
			return fmt.Errorf("SSD tier ID: %w", err)
		}
		sb.ID = hex.EncodeToString(id[:])
	}
	sb.Epoch++
	sb.Open = true
	if err := j.store.SetSuperblock(sb); err != nil {
		return fmt.Errorf("SSD tier metadata: %w", err)
	}
	if path == "" {
		return nil
	}
	l, err := runlog.Create(path, runlog.Identity{Tier: sb.ID, Epoch: sb.Epoch}, j.shape(), 0)
	if err != nil {
		j.t.log.Warn("no run log: a kill of tierblk will lose the index records written since the last checkpoint; give --run-dir (run_dir) a directory on a tmpfs this user may write", "err", err)
		return nil
	}
	j.t.mu.Lock()
	j.log = l
	j.t.mu.Unlock()
	return nil
}

// closeLog closes the run log, leaving it as it is for the next run.
func (j *journal) closeLog() error {
	j.t.mu.Lock()
	l := j.log
	j.log = nil
	j.t.mu.Unlock()
	return l.Close()
}

// errNoRunLog is what Recovered reports when the last run left no log to replay.
var errNoRunLog = errors.New("no run log of the last run")

// errRunLogRecord wraps load's error for a record of the run log that the store's index cannot take
// (a slot another line holds, bits that do not fit): the log, not the store, is wrong.
var errRunLogRecord = errors.New("a record of the run log does not fit the SSD tier's index")

// closed notes in the superblock that the tier was closed after its last checkpoint (Open).
func (j *journal) closed() error {
	return j.updateSuperblock(func(sb *meta.Superblock) { sb.Open = false })
}

// updateSuperblock changes the stored superblock with fn, one change at a time (the lost ranges
// change while requests run).
func (j *journal) updateSuperblock(fn func(*meta.Superblock)) error {
	j.sbMu.Lock()
	defer j.sbMu.Unlock()
	sb, ok, err := j.store.Superblock()
	if err != nil || !ok {
		return err
	}
	fn(&sb)
	return j.store.SetSuperblock(sb)
}
