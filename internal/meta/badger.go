package meta

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/options"
)

// maxGroup bounds how many Commit calls one group write takes, so that a steady stream of
// committers cannot starve the ones already waiting.
const maxGroup = 1024

// lockName is the file a Badger flocks in its directory. Badger locks the directory too, but its
// error does not say that another tierblk holds it.
const lockName = "tierblk.lock"

// Badger is a Store on a badger database in one directory. A single goroutine writes: concurrent
// Commit calls queue for it, and it writes all that are waiting in one transaction and, when any
// of them asked for sync, syncs once for them all.
type Badger struct {
	db   *badger.DB
	dir  string
	lock *os.File

	reqs    chan *request
	stopped chan struct{}

	mu     sync.Mutex
	closed bool
	active sync.WaitGroup // calls in progress, which Close waits for
}

var _ Store = (*Badger)(nil)

type request struct {
	ops  []Op
	sync bool
	err  error
	done chan error
}

// OpenBadger opens (creating it if needed) the store in dir. Log receives badger's messages: its
// errors and warnings as such, its chatter at debug level; nil discards them.
func OpenBadger(dir string, log *slog.Logger) (*Badger, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("meta: creating metadata directory: %w", err)
	}
	if err := room(dir, MinFree); err != nil {
		return nil, err
	}
	lock, err := lockDir(dir)
	if err != nil {
		return nil, err
	}
	if err := removeEmptyLogs(dir, log); err != nil {
		lock.Close()
		return nil, err
	}
	db, err := badger.Open(badgerOptions(dir, log))
	if err != nil {
		lock.Close()
		return nil, fmt.Errorf("meta: opening metadata in %s: %w", dir, err)
	}
	if err := verifyTables(db); err != nil {
		db.Close()
		lock.Close()
		return nil, fmt.Errorf("meta: the metadata in %s is damaged (%w): it cannot be trusted", dir, err)
	}
	b := &Badger{
		db:      db,
		dir:     dir,
		lock:    lock,
		reqs:    make(chan *request, maxGroup),
		stopped: make(chan struct{}),
	}
	go b.run()
	return b, nil
}

// verifyTables checks every block of db's tables against its checksum. Badger's own check
// dereferences a nil block when a block fails as it is read (badger v4.9.6, table.VerifyChecksum):
// that panic is this error too.
func verifyTables(db *badger.DB) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("a table fails its checksum: %v", r)
		}
	}()
	return db.VerifyChecksum()
}

// MinFree is the free space the metadata directory's file system must keep for badger to write:
// its memory tables and value log files are memory-mapped (badgerOptions: two tables and a log
// file of 16 MiB each, and a level-0 table as a memory table is flushed), and a write to a mapped
// page that a full file system cannot back ends the process with SIGBUS. Below it, the store
// opens and writes nothing, with ErrNoSpace, except commits of invalidations alone
// (Op.Invalidates), down to ReserveFree: still room for badger to flush a full memory table.
const (
	MinFree     = 64 << 20
	ReserveFree = 32 << 20
)

// ErrNoSpace is wrapped by the errors of a store whose file system has too little free space.
var ErrNoSpace = errors.New("no room for metadata")

// free returns the bytes free for this process on dir's file system.
func free(dir string) (uint64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, fmt.Errorf("meta: free space of %s: %w", dir, err)
	}
	return st.Bavail * uint64(st.Bsize), nil
}

// room returns an error wrapping ErrNoSpace when dir's file system has less than need free now.
func room(dir string, need uint64) error {
	f, err := free(dir)
	if err != nil {
		return err
	}
	return enough(dir, f, need)
}

// enough returns an error wrapping ErrNoSpace when f, the free space of dir's file system, is less
// than need.
func enough(dir string, f, need uint64) error {
	if f < need {
		return fmt.Errorf("meta: %w: the file system of %s has %d MiB free, less than the %d MiB the metadata store needs to write safely; free some space there (the SSD tier is bypassed until then, and tried again)",
			ErrNoSpace, dir, f>>20, need>>20)
	}
	return nil
}

// need is the free space a commit of ops needs: ReserveFree for invalidations alone, MinFree for
// any other, and on top the bytes of the ghosts it stores, a block's each at most, which a commit
// of many ghosts makes a lot more than a record's few KiB.
func need(ops []Op) uint64 {
	base, ghosts := uint64(ReserveFree), uint64(0)
	for _, op := range ops {
		switch {
		case op.Ghost != nil && !op.Delete:
			base = MinFree
			ghosts += ghostKeyLen + 4 + uint64(len(op.Ghost.Data))
		case !op.Invalidates:
			base = MinFree
		}
	}
	return base + ghosts
}

// The memory of one store: its memory tables (each an arena on the heap of about 1.3 times its
// size, and a log of its size mapped from the store's directory) and its index cache.
const (
	badgerMemTable   = 2 << 20
	badgerMemTables  = 2
	badgerIndexCache = 4 << 20
	// BadgerMemoryBytes is the most RAM one store takes, which the daemon's memory bound counts
	// for each SSD tier (docs/operations.md, "How much RAM"); BadgerMappedBytes of it are its
	// memory tables' logs, mapped files rather than the Go heap.
	BadgerMemoryBytes = badgerMemTables*(badgerMemTable*13/10) + BadgerMappedBytes + badgerIndexCache
	BadgerMappedBytes = badgerMemTables * badgerMemTable
)

// badgerOptions keeps badger small: the SSD tier may hold 16 million lines, and the metadata must
// not cost more memory than the cache's own per-line state. Small memory tables make more and
// smaller tables to compact, and a checkpoint larger than a transaction goes in parts (Parts).
func badgerOptions(dir string, log *slog.Logger) badger.Options {
	return badger.DefaultOptions(dir).
		WithLogger(badgerLogger{log}).
		WithMemTableSize(badgerMemTable).
		WithNumMemtables(badgerMemTables).
		WithNumLevelZeroTables(2).
		WithNumLevelZeroTablesStall(8).
		WithNumCompactors(2).
		WithNumGoroutines(2).
		// Records (a few KiB at most) stay in the LSM tree, so the value log is unused: keep
		// its mapped file small. The threshold must be below the largest transaction, 15 % of
		// a memory table.
		WithValueThreshold(64 << 10).
		WithValueLogFileSize(16 << 20).
		// Bitmaps barely compress and, without compression, the block cache would only
		// duplicate the page cache over the mapped tables.
		WithCompression(options.None).
		WithBlockCacheSize(0).
		// Bounds the memory of table indexes and bloom filters, which otherwise grow with
		// the number of lines.
		WithIndexCacheSize(badgerIndexCache).
		// One goroutine writes, so there are no conflicts to detect.
		WithDetectConflicts(false).
		// Each block of a table is checked as it is read, and every table once when the
		// store opens (verifyTables): a damaged record is never trusted
		// (TestBadgerDamagedTable). Checking blocks as they are read is not enough alone:
		// badger's iterators end quietly at a block that fails, and Lines would leave out the
		// records after it.
		WithChecksumVerificationMode(options.OnBlockRead).
		WithMetricsEnabled(false)
}

// removeEmptyLogs removes the memory-table and value-log files of dir that are empty. Badger
// creates such a file and then sizes it; a crash in between leaves it empty, and badger v4 then
// refuses to open the directory, taking the sentinel its file code returns for a new file for a
// failure (dgraph-io/badger#2207; make crash-campaign met it once in about 800 kills). A file
// that was never written holds nothing. TestOpenAfterEmptyLogs.
func removeEmptyLogs(dir string, log *slog.Logger) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("meta: reading metadata directory: %w", err)
	}
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, ".mem") && !strings.HasSuffix(name, ".vlog") {
			continue
		}
		info, err := e.Info()
		if err != nil {
			return fmt.Errorf("meta: %w", err)
		}
		if !info.Mode().IsRegular() || info.Size() != 0 {
			continue
		}
		if err := os.Remove(filepath.Join(dir, name)); err != nil {
			return fmt.Errorf("meta: removing the empty file %s a crash left: %w", name, err)
		}
		log.Info("meta: removed an empty file a crash left", "file", filepath.Join(dir, name))
	}
	return nil
}

// lockDir takes an exclusive lock on dir for this process, so that a second daemon on the same
// directory fails with an error that says so.
func lockDir(dir string) (*os.File, error) {
	name := filepath.Join(dir, lockName)
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("meta: opening lock file: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		holder := ""
		if pid, rerr := os.ReadFile(name); rerr == nil && len(strings.TrimSpace(string(pid))) > 0 {
			holder = " (pid " + strings.TrimSpace(string(pid)) + ")"
		}
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("meta: metadata directory %s is in use by another tierblk%s", dir, holder)
		}
		return nil, fmt.Errorf("meta: locking metadata directory %s: %w", dir, err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return f, nil
}

// enter registers a call in progress, or reports that the store is closed.
func (b *Badger) enter() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return ErrClosed
	}
	b.active.Add(1)
	return nil
}

// Superblock implements Store.
func (b *Badger) Superblock() (Superblock, bool, error) {
	if err := b.enter(); err != nil {
		return Superblock{}, false, err
	}
	defer b.active.Done()
	var sb Superblock
	err := b.db.View(func(txn *badger.Txn) error {
		item, err := txn.Get(superblockKey)
		if err != nil {
			return err
		}
		return item.Value(func(v []byte) error { return json.Unmarshal(v, &sb) })
	})
	switch {
	case errors.Is(err, badger.ErrKeyNotFound):
		return Superblock{}, false, nil
	case err != nil:
		return Superblock{}, false, fmt.Errorf("meta: reading superblock, key %x: %w", superblockKey, err)
	}
	return sb, true, nil
}

// SetSuperblock implements Store.
func (b *Badger) SetSuperblock(sb Superblock) error {
	if err := b.enter(); err != nil {
		return err
	}
	defer b.active.Done()
	if err := room(b.dir, MinFree); err != nil {
		return err
	}
	v, err := json.Marshal(sb)
	if err != nil {
		return fmt.Errorf("meta: encoding superblock: %w", err)
	}
	if err := b.db.Update(func(txn *badger.Txn) error { return txn.Set(superblockKey, v) }); err != nil {
		return fmt.Errorf("meta: writing superblock: %w", err)
	}
	if err := b.db.Sync(); err != nil {
		return fmt.Errorf("meta: syncing superblock: %w", err)
	}
	return nil
}

// Commit implements Store. A commit too large for one badger transaction (tens of thousands of
// ops, but only some 76 ghosts of 4 KiB blocks: a transaction holds some 300 KiB) fails alone
// with ErrTooBig, without affecting the others written with it.
func (b *Badger) Commit(ops []Op, sync bool) error {
	if err := checkOps(ops); err != nil {
		return err
	}
	if err := b.enter(); err != nil {
		return err
	}
	defer b.active.Done()
	r := &request{ops: ops, sync: sync, done: make(chan error, 1)}
	b.reqs <- r
	return <-r.done
}

// Sync implements Store.
func (b *Badger) Sync() error {
	if err := b.enter(); err != nil {
		return err
	}
	defer b.active.Done()
	if err := b.db.Sync(); err != nil {
		return fmt.Errorf("meta: syncing: %w", err)
	}
	return nil
}

// Lines implements Store. It reads a snapshot taken when it starts; fn may commit.
func (b *Badger) Lines(fn func(Line) error) error {
	return scan(b, linePrefix, decodeLine, fn)
}

// Ghosts implements Store. It reads a snapshot taken when it starts; fn may commit.
func (b *Badger) Ghosts(fn func(Ghost) error) error {
	return scan(b, ghostPrefix, decodeGhost, fn)
}

// scan calls fn with every value stored under a key that starts with prefix, in key order, as
// decode makes it of the key and value (copying what it keeps: both are badger's), from a
// snapshot taken when it starts.
func scan[T any](b *Badger, prefix byte, decode func(key, val []byte) (T, error), fn func(T) error) error {
	if err := b.enter(); err != nil {
		return err
	}
	defer b.active.Done()
	return b.db.View(func(txn *badger.Txn) error {
		opts := badger.DefaultIteratorOptions
		opts.Prefix = []byte{prefix}
		opts.PrefetchValues = false // values are inline: item.Value reads them without I/O
		it := txn.NewIterator(opts)
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			item := it.Item()
			var rec T
			err := item.Value(func(v []byte) error {
				var err error
				rec, err = decode(item.Key(), v)
				return err
			})
			if err != nil {
				return err
			}
			if err := fn(rec); err != nil {
				return err
			}
		}
		return nil
	})
}

// Close implements Store. It waits for the calls in progress, then closes the database, which
// writes its memory tables to disk.
func (b *Badger) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return ErrClosed
	}
	b.closed = true
	b.mu.Unlock()
	b.active.Wait()
	close(b.reqs)
	<-b.stopped
	if err := room(b.dir, ReserveFree); err != nil {
		// Closing flushes badger's memory table into a new table file: on a full file system
		// that write ends the process (SIGBUS). Its log, synced, holds every commit, which the
		// next open reads back.
		err = errors.Join(err, b.db.Sync(), b.lock.Close())
		return fmt.Errorf("meta: metadata in %s left as its log holds it, not closed: %w", b.dir, err)
	}
	err := b.db.Close()
	if cerr := b.lock.Close(); err == nil { // closing the file releases the flock
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("meta: closing metadata in %s: %w", b.dir, err)
	}
	return nil
}

// run is the committer: it takes every request waiting and writes them as one group.
func (b *Badger) run() {
	defer close(b.stopped)
	group := make([]*request, 0, maxGroup)
	for r := range b.reqs {
		group = append(group[:0], r)
	drain:
		for len(group) < maxGroup {
			select {
			case r, ok := <-b.reqs:
				if !ok {
					break drain
				}
				group = append(group, r)
			default:
				break drain
			}
		}
		b.write(group)
	}
}

// write writes a group in order, in as few transactions as fit, never splitting a request, and
// answers every request: those without sync as soon as they are written, those with sync after
// the one sync they share. Once a transaction fails, the requests after it are not written, so
// that no commit becomes visible without the ones before it.
func (b *Badger) write(group []*request) {
	f, failed := free(b.dir)
	for i := 0; i < len(group); {
		if failed == nil {
			if err := enough(b.dir, f, need(group[i].ops)); err != nil {
				// This request alone is refused; later ones may need less room.
				group[i].err = err
				i++
				continue
			}
		}
		if failed != nil {
			group[i].err = fmt.Errorf("meta: commit not written after an earlier one failed: %w", failed)
			i++
			continue
		}
		// The requests after it that have room too go in one transaction with it.
		k := i + 1
		for k < len(group) && enough(b.dir, f, need(group[k].ops)) == nil {
			k++
		}
		n, err := b.writeTxn(group[i:k])
		if errors.Is(err, badger.ErrTxnTooBig) {
			// Only this request is at fault; it was not written.
			group[i].err = fmt.Errorf("%w: %d ops: %w", ErrTooBig, len(group[i].ops), err)
		} else if err != nil {
			failed = fmt.Errorf("meta: writing metadata: %w", err)
			for _, r := range group[i : i+n] {
				r.err = failed
			}
		}
		i += n
	}
	syncing := false
	for _, r := range group {
		if r.sync && r.err == nil {
			syncing = true
			continue
		}
		r.done <- r.err
	}
	if !syncing {
		return
	}
	err := b.db.Sync()
	if err != nil {
		err = fmt.Errorf("meta: syncing metadata: %w", err)
	}
	for _, r := range group {
		if r.sync && r.err == nil {
			r.done <- err
		}
	}
}

// writeTxn writes the longest prefix of reqs that fits one transaction and returns its length.
// When reqs[0] alone does not fit, it returns 1 and badger.ErrTxnTooBig.
func (b *Badger) writeTxn(reqs []*request) (int, error) {
	txn := b.db.NewTransaction(true)
	defer txn.Discard()
	for i, r := range reqs {
		err := applyOps(txn, r.ops)
		switch {
		case errors.Is(err, badger.ErrTxnTooBig) && i > 0:
			// reqs[:i] fitted before reqs[i] was added.
			txn.Discard()
			return b.writeTxn(reqs[:i])
		case errors.Is(err, badger.ErrTxnTooBig):
			return 1, err
		case err != nil:
			return len(reqs), err
		}
	}
	return len(reqs), txn.Commit()
}

func applyOps(txn *badger.Txn, ops []Op) error {
	for _, op := range ops {
		key := lineKey(op.Rec.Line)
		if op.Ghost != nil {
			key = ghostKey(op.Ghost)
		}
		var err error
		switch {
		case op.Delete:
			err = txn.Delete(key)
		case op.Ghost != nil:
			err = txn.Set(key, encodeGhost(op.Ghost))
		default:
			err = txn.Set(key, encodeLine(op.Rec))
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// badgerLogger routes badger's log to slog. Badger's info messages (compactions, table flushes)
// are routine for tierblk, so they go to debug.
type badgerLogger struct{ log *slog.Logger }

func (l badgerLogger) Errorf(f string, args ...any)   { l.emit(slog.LevelError, f, args) }
func (l badgerLogger) Warningf(f string, args ...any) { l.emit(slog.LevelWarn, f, args) }
func (l badgerLogger) Infof(f string, args ...any)    { l.emit(slog.LevelDebug, f, args) }
func (l badgerLogger) Debugf(f string, args ...any)   { l.emit(slog.LevelDebug, f, args) }

func (l badgerLogger) emit(level slog.Level, f string, args []any) {
	ctx := context.Background()
	if !l.log.Enabled(ctx, level) {
		return
	}
	l.log.Log(ctx, level, strings.TrimSpace(fmt.Sprintf(f, args...)), "component", "badger")
}
