// Package iscsi is a native iSCSI initiator (RFC 7143) that opens one LUN of a target as a
// backend.Backend: iscsi://[USER[%PASSWORD]@]HOST[:PORT]/TARGET-IQN/LUN, the URL form of libiscsi
// and qemu. It logs in with no authentication or with CHAP (MD5; mutual CHAP when the target's
// credentials are set), negotiates digests and burst sizes, and runs many commands at once over one
// session: READ(16) and WRITE(16) (with FUA), SYNCHRONIZE CACHE(16) for flush, UNMAP for trim and
// WRITE SAME(16) for write-zeroes where the LUN has them. Requests at any byte offset are served:
// partial blocks are read, patched and written back under a lock on those blocks.
//
// It is written from the RFC in Go, without cgo or another iSCSI library, so that tierblk owns its
// protocols. Everything a target sends is checked before it is used: lengths against what was
// negotiated and asked for, sequence numbers, task tags. A malformed or hostile PDU ends the
// session with an error naming it, never a panic or an allocation sized by the target.
//
// It must never claim an ability the LUN lacks (trim without UNMAP and write-zeroes without WRITE
// SAME fail with backend.ErrNotSupported, so that the volume above skips or emulates them), never
// report a write done before the target's GOOD status, and never put a CHAP secret in a message.
//
// Error recovery level 0 and one connection per session: a lost connection ends the session, and
// the backend logs in again and runs the commands that were in flight on the new one (link.go).
package iscsi

import (
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"sync/atomic"
	"time"

	"github.com/tierblk/tierblk/internal/blocklock"
	"github.com/tierblk/tierblk/internal/bufpool"
	"github.com/tierblk/tierblk/pkg/backend"
)

const (
	dialTimeout  = 10 * time.Second
	loginTimeout = 30 * time.Second
	maxRedirects = 4
	// maxCommand caps the bytes of one READ or WRITE whatever the target allows, so that a request
	// is split into commands that can run at once.
	maxCommand = 1 << 20
	// maxParallel bounds the commands one request runs at once.
	maxParallel = 16
	// maxUnmapDescs bounds the extents of one UNMAP (its parameter list: 8 + 16 per extent).
	maxUnmapDescs = 64
	// maxWriteSameDefault bounds one WRITE SAME when the LUN states no limit: a target without
	// UNMAP writes each block, and one command should not take minutes.
	maxWriteSameDefault = 1 << 16
)

// Open logs in to the LUN the URL names. It matches backend.Factory; the registry parses the URL
// with ParseURL.
func Open(u *url.URL, opts backend.Options) (backend.Backend, error) {
	cfg, err := parseConfig(u, os.Getenv)
	if err != nil {
		return nil, backend.BadURL(err)
	}
	return dial(cfg, opts, defaultTiming)
}

// Backend is one LUN. It implements backend.Backend, Trimmer, ZeroWriter, FUAWriter,
// ReadOnlyReporter, Waiter, AsyncReader, AsyncWriter, Plugger and RunDeferrer.
type Backend struct {
	l        *link
	li       lunInfo
	size     int64
	readOnly bool
	// cmdBlocks is the most blocks one READ or WRITE moves.
	cmdBlocks int64
	closed    atomic.Bool
	waits     atomic.Uint64
	// plugs counts the callers between Plug and Unplug: while any is, the asynchronous commands
	// started are held to go out together.
	plugs atomic.Int32
	// What the LUN refused once is not asked again.
	noWriteSame, noWriteSameUnmap, noSync16 atomic.Bool
	// rmwLocks serialises read-modify-write of partial blocks, striped by block number.
	rmwLocks blocklock.Stripes
}

// dial connects, follows redirects, logs in and asks the LUN what it is.
func dial(cfg config, opts backend.Options, tm timing) (*Backend, error) {
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	isid := newISID()
	s, res, err := connect(cfg, isid, log, tm)
	if err != nil {
		return nil, err
	}
	// Logging in again uses the same ISID, so that the target reinstates the session (session
	// reinstatement, RFC 7143) and drops what the lost one left running.
	again := func() (*session, error) {
		s, _, err := connect(cfg, isid, log, tm)
		return s, err
	}
	b, err := newBackend(s, cfg.lun, opts, again, cfg.reconnectWait, log)
	if err != nil {
		s.close()
		return nil, err
	}
	log.Debug("iscsi: logged in", "target", s.name, "lun", cfg.lun, "vendor", b.li.vendor, "product", b.li.product,
		"block_size", b.li.blockSize, "size", b.size, "params", fmt.Sprintf("%+v", res.params))
	return b, nil
}

// connect connects, follows redirects and logs in to cfg's target with isid, for a session on
// cfg's LUN.
func connect(cfg config, isid [6]byte, log *slog.Logger, tm timing) (*session, *loginResult, error) {
	initiator := cfg.initiator
	if initiator == "" {
		initiator = defaultInitiator()
	}
	addr := cfg.addr
	for redirects := 0; ; redirects++ {
		conn, err := net.DialTimeout("tcp", addr, dialTimeout)
		if err != nil {
			return nil, nil, fmt.Errorf("iscsi: %w", err)
		}
		_ = conn.SetDeadline(time.Now().Add(loginTimeout))
		res, err := login(conn, &cfg, addr, initiator, isid)
		var redirect *redirectError
		if errors.As(err, &redirect) && redirects < maxRedirects {
			conn.Close()
			log.Info("iscsi: login redirected", "target", cfg.target, "from", addr, "to", redirect.addr)
			addr = redirect.addr
			continue
		}
		if err != nil {
			conn.Close()
			return nil, nil, err
		}
		_ = conn.SetDeadline(time.Time{})
		return newSession(conn, res, cfg.lun, cfg.target+" at "+addr, log, tm), res, nil
	}
}

// newISID returns a random session identifier.
func newISID() [6]byte {
	var isid [6]byte
	_, _ = rand.Read(isid[1:]) // never fails (crypto/rand)
	isid[0] = 0x80             // format "random" (RFC 7143 section 11.12.5)
	return isid
}

// newBackend probes the LUN on s. When s ends, connect logs in again; a command waits up to
// maxWait for it.
func newBackend(s *session, lun uint64, opts backend.Options, connect func() (*session, error), maxWait time.Duration, log *slog.Logger) (*Backend, error) {
	li, err := s.probe(lun)
	if err != nil {
		return nil, err
	}
	b := &Backend{li: li, size: int64(li.blocks) * li.blockSize, readOnly: opts.ReadOnly || li.writeProtect}
	cmd := min(int64(maxCommand), int64(s.p.maxBurst)) / li.blockSize
	if li.maxTransfer > 0 {
		cmd = min(cmd, int64(li.maxTransfer))
	}
	b.cmdBlocks = max(cmd, 1)
	b.l = newLink(s, maxWait, log, func() (*session, error) {
		s, err := connect()
		if err != nil {
			return nil, err
		}
		got, err := s.probe(lun)
		if err == nil && (got.blocks != li.blocks || got.blockSize != li.blockSize) {
			err = fmt.Errorf("iscsi: LUN %d of %s is now %d blocks of %d bytes, not %d of %d as when opened; not using it",
				lun, s.name, got.blocks, got.blockSize, li.blocks, li.blockSize)
		}
		if err != nil {
			s.close()
			return nil, err
		}
		return s, nil
	})
	return b, nil
}

// check validates a request before it reaches the target.
func (b *Backend) check(off, length int64, write bool) error {
	switch {
	case b.closed.Load():
		return fmt.Errorf("%w: iscsi %s", backend.ErrClosed, b.l.name)
	case write && b.readOnly:
		return fmt.Errorf("%w: iscsi %s", backend.ErrReadOnly, b.l.name)
	}
	return backend.CheckRange(off, length, b.size)
}

// Size implements backend.Backend.
func (b *Backend) Size() int64 { return b.size }

// ReadOnly implements backend.ReadOnlyReporter: opened read-only, or the LUN is write-protected.
func (b *Backend) ReadOnly() bool { return b.readOnly }

// Waits implements backend.Waiter: every request goes over the network.
func (b *Backend) Waits() uint64 { return b.waits.Load() }

// Close logs out and closes the connection. It does not flush.
func (b *Backend) Close() error {
	if b.closed.Swap(true) {
		return nil
	}
	b.l.close()
	return nil
}

// ReadAt implements backend.Backend.
func (b *Backend) ReadAt(p []byte, off int64) (int, error) {
	if send, err := b.begin(off, len(p), false); !send {
		return 0, err
	}
	bs := b.li.blockSize
	if off%bs == 0 && int64(len(p))%bs == 0 {
		return b.done(len(p), b.readBlocks(p, off/bs))
	}
	// Unaligned: read the blocks around the request into a bounce buffer, a window at a time.
	for rest, pos := p, off; len(rest) > 0; {
		w, we := b.window(pos, pos+int64(len(rest)))
		buf := bufpool.Get(int(we - w))
		err := b.readBlocks((*buf)[:we-w], w/bs)
		n := copy(rest, (*buf)[pos-w:we-w])
		bufpool.Put(buf)
		if err != nil {
			return 0, err
		}
		rest, pos = rest[n:], pos+int64(n)
	}
	return len(p), nil
}

// begin checks a read or write of n bytes at off and counts it; it reports false, with the error
// if any, where there is nothing to send.
func (b *Backend) begin(off int64, n int, write bool) (bool, error) {
	if err := b.check(off, int64(n), write); err != nil {
		return false, err
	}
	if n == 0 {
		return false, nil
	}
	b.waits.Add(1)
	return true, nil
}

// ReadAtAsync implements backend.AsyncReader for a read of whole blocks that one command moves:
// it sends the command and returns, and the session's reader calls done when the target has
// answered, so that no goroutine waits for each read (bench nbd --parts iscsi measures it). What
// the plain way handles (a status to retry, a session lost meanwhile) goes to it, on a goroutine of
// its own; a read that needs more than one command is not started.
func (b *Backend) ReadAtAsync(p []byte, off int64, done func(error)) bool {
	return b.startAsync(p, off, false, false, done)
}

// WriteAtAsync implements backend.AsyncWriter as ReadAtAsync does reads, for a write of whole
// blocks whose data fits in its command's PDU (immediate data), with the FUA bit where asked (a
// LUN without it is not started: its FUA writes are a write and a flush).
func (b *Backend) WriteAtAsync(p []byte, off int64, fua bool, done func(error)) bool {
	return b.startAsync(p, off, true, fua, done)
}

// Plug implements backend.Plugger: the asynchronous reads and writes started until the matching
// Unplug are held, and sent together (one system call, and one read of the target's, for a batch
// of commands an NBD client pipelined: bench nbd --parts iscsi's 4K rows).
func (b *Backend) Plug() { b.plugs.Add(1) }

// Unplug implements backend.Plugger: it sends what was held, unless another caller still holds
// the plug.
func (b *Backend) Unplug() {
	if b.plugs.Add(-1) > 0 {
		return
	}
	if s := b.l.current(); s != nil {
		s.unplug(&b.plugs)
	}
}

// AtRunEnd implements backend.RunDeferrer: f is called by the session's reader once it has
// ended the commands that one read of its socket answered.
func (b *Backend) AtRunEnd(f func()) bool {
	s := b.l.current()
	return s != nil && s.atRunEnd(f)
}

func (b *Backend) startAsync(p []byte, off int64, write, fua bool, done func(error)) bool {
	bs := b.li.blockSize
	n := int64(len(p))
	if n == 0 || off%bs != 0 || n%bs != 0 || n/bs > b.cmdBlocks || fua && !b.li.fua || b.check(off, n, write) != nil {
		return false
	}
	s := b.l.current()
	if s == nil {
		return false
	}
	lba := off / bs
	op, flags, read, data := byte(scsiRead16), byte(0), p, []byte(nil)
	if write {
		op, read, data = scsiWrite16, nil, p
		if fua {
			flags = cdbFUA
		}
	}
	started := s.start(cdbBlocks(op, flags, uint64(lba), uint32(n/bs)), read, data, &b.plugs, func(t *task) {
		if t.good() {
			done(nil)
			return
		}
		go func() {
			if write {
				done(b.writeBlocks(p, lba, fua))
			} else {
				done(b.readBlocks(p, lba))
			}
		}()
	})
	if started {
		b.waits.Add(1)
	}
	return started
}

// done is a request's result: all of it, or nothing and the error.
func (b *Backend) done(n int, err error) (int, error) {
	if err != nil {
		return 0, err
	}
	return n, nil
}

// WriteAt implements backend.Backend.
func (b *Backend) WriteAt(p []byte, off int64) (int, error) {
	return b.write(p, off, false)
}

// WriteAtFUA implements backend.FUAWriter: the FUA bit where the LUN honours it, else a write and
// a SYNCHRONIZE CACHE of its blocks.
func (b *Backend) WriteAtFUA(p []byte, off int64) (int, error) {
	return b.write(p, off, true)
}

func (b *Backend) write(p []byte, off int64, fua bool) (int, error) {
	if send, err := b.begin(off, len(p), true); !send {
		return 0, err
	}
	bs := b.li.blockSize
	if off%bs == 0 && int64(len(p))%bs == 0 {
		return b.done(len(p), b.writeBlocks(p, off/bs, fua))
	}
	for rest, pos := p, off; len(rest) > 0; {
		w, we := b.window(pos, pos+int64(len(rest)))
		n := int(min(int64(len(rest)), we-pos))
		buf := bufpool.Get(int(we - w))
		err := b.rmw((*buf)[:we-w], w, rest[:n], pos, fua)
		bufpool.Put(buf)
		if err != nil {
			return 0, err
		}
		rest, pos = rest[n:], pos+int64(n)
	}
	return len(p), nil
}

// Flush implements backend.Backend with a SYNCHRONIZE CACHE of the whole LUN. It fails, once, if
// a session ended with acknowledged writes that no flush had covered (link.go).
func (b *Backend) Flush() error {
	if err := b.check(0, 0, false); err != nil {
		return err
	}
	b.waits.Add(1)
	return b.syncCache(0, 0, true, 0)
}

// syncCache makes blocks [lba, lba+n) durable (0, 0: all of them; all: a whole flush), with
// SYNCHRONIZE CACHE(16), or (10) on a LUN without it; see link.sync for losses.
func (b *Backend) syncCache(lba uint64, n uint32, all bool, losses uint64) error {
	if !b.noSync16.Load() {
		err := b.l.sync(cdbBlocks(scsiSyncCache16, 0, lba, n), all, losses)
		if !errors.Is(err, backend.ErrNotSupported) {
			return err
		}
		b.noSync16.Store(true)
	}
	// The 10-byte form has a 32-bit LBA and a 16-bit count: flush everything.
	return b.l.sync([]byte{scsiSyncCache10, 0, 0, 0, 0, 0, 0, 0, 0, 0}, all, losses)
}

// Trim implements backend.Trimmer with UNMAP of the whole blocks in the range; the partial blocks
// at its ends are left as they are (a trim is advisory). A LUN without UNMAP fails with
// backend.ErrNotSupported.
func (b *Backend) Trim(off, length int64) error {
	if err := b.check(off, length, true); err != nil {
		return err
	}
	if !b.li.lbpu {
		return fmt.Errorf("%w: LUN of %s has no UNMAP", backend.ErrNotSupported, b.l.name)
	}
	bs := b.li.blockSize
	lba, end := (off+bs-1)/bs, (off+length)/bs
	if lba >= end {
		return nil
	}
	b.waits.Add(1)
	most := int64(b.li.maxUnmapBlocks)
	if most == 0 {
		most = 1<<32 - 1
	}
	descs := int(min(max(b.li.maxUnmapDescs, 1), maxUnmapDescs))
	for l := lba; l < end; {
		var extents [][2]uint64
		for l < end && len(extents) < descs {
			n := min(most, end-l)
			extents = append(extents, [2]uint64{uint64(l), uint64(n)})
			l += n
		}
		list := unmapList(extents)
		if _, err := b.l.exec(cdbUnmap(len(list)), nil, list); err != nil {
			return err
		}
	}
	return nil
}

// WriteZeroes implements backend.ZeroWriter: WRITE SAME(16) of a zero block over the whole blocks
// (with its UNMAP bit when mayUnmap and the LUN reads unmapped blocks as zeroes), the partial
// blocks at the ends through read-modify-write. A LUN without WRITE SAME(16) fails with
// backend.ErrNotSupported, so that the caller writes zeroes as data, or not at all where it asked
// for a fast zero.
func (b *Backend) WriteZeroes(off, length int64, mayUnmap bool) error {
	if err := b.check(off, length, true); err != nil {
		return err
	}
	if length == 0 {
		return nil
	}
	if b.noWriteSame.Load() {
		return fmt.Errorf("%w: LUN of %s has no WRITE SAME(16)", backend.ErrNotSupported, b.l.name)
	}
	bs := b.li.blockSize
	lba, end := (off+bs-1)/bs, (off+length)/bs
	if lba >= end { // within one block, or across the boundary of two
		_, err := b.write(make([]byte, length), off, false)
		return err
	}
	if head := lba*bs - off; head > 0 {
		if _, err := b.write(make([]byte, head), off, false); err != nil {
			return err
		}
	}
	if tail := off + length - end*bs; tail > 0 {
		if _, err := b.write(make([]byte, tail), end*bs, false); err != nil {
			return err
		}
	}
	b.waits.Add(1)
	return b.zeroBlocks(lba, end-lba, mayUnmap)
}

// zeroBlocks zeroes whole blocks with WRITE SAME(16). The UNMAP bit is set only where unmapped
// blocks read as zeroes (LBPRZ), as Linux's sd driver does: elsewhere it could leave other data.
func (b *Backend) zeroBlocks(lba, n int64, mayUnmap bool) error {
	most := int64(maxWriteSameDefault)
	if b.li.maxWriteSame > 0 {
		most = int64(min(b.li.maxWriteSame, 1<<32-1))
	}
	block := make([]byte, b.li.blockSize)
	unmap := mayUnmap && b.li.lbpws && b.li.lbprz && !b.noWriteSameUnmap.Load()
	err := pieces(lba, n, most, func(l, m int64) error {
		if unmap {
			_, err := b.l.exec(cdbBlocks(scsiWriteSame16, cdbUnmapBit, uint64(l), uint32(m)), nil, block)
			if !errors.Is(err, backend.ErrNotSupported) {
				return err
			}
			b.noWriteSameUnmap.Store(true)
		}
		_, err := b.l.exec(cdbBlocks(scsiWriteSame16, 0, uint64(l), uint32(m)), nil, block)
		return err
	})
	if errors.Is(err, backend.ErrNotSupported) {
		b.noWriteSame.Store(true)
	}
	return err
}
