package iscsi

// The backend's own choices, against a LUN with the abilities each test gives it: what it does
// where a LUN lacks a command, how it splits requests by the LUN's limits, what it makes of the
// LUN's errors. The conformance suite runs against tgtd (integration/iscsibackend_test.go), which
// has every ability.

import (
	"bytes"
	"encoding/binary"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/pkg/backend"
)

const fakeBlock = 512

// fakeLUN is the SCSI side of a fake target: a disk of 512-byte blocks with the abilities a test
// gives it, that records every command's CDB.
type fakeLUN struct {
	disk         []byte
	devType      byte   // peripheral byte of the standard INQUIRY (0: a disk)
	blockLimits  []byte // the Block Limits VPD page; nil for none
	provisioning byte   // byte 5 of the Logical Block Provisioning VPD page; 0 for no page
	deviceParam  byte   // the mode parameter header's device-specific byte (WP 0x80, DPOFUA 0x10)
	refuse       map[byte]bool
	refuseUnmap  bool   // WRITE SAME with the UNMAP bit: invalid field in CDB
	failWrites   *Sense // writes end in CHECK CONDITION with this sense
	failReads    *Sense // reads too
	senseOnce    *Sense // the next command does, once
	// before, if set, sees each command before it runs (outside mu): a test drops the connection.
	before atomic.Pointer[func(cdb []byte)]
	mu     sync.Mutex
	cmds   [][]byte
}

func checkCondition(key, asc, ascq byte) (byte, []byte) {
	return statusCheckCondition, []byte{0x70, 0, key, 0, 0, 0, 0, 10, 0, 0, 0, 0, asc, ascq, 0, 0, 0, 0}
}

// handle runs one command: out is its Data-Out, in what goes back.
func (l *fakeLUN) handle(cdb, out []byte) (status byte, sense, in []byte) {
	if f := l.before.Load(); f != nil {
		(*f)(cdb)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.cmds = append(l.cmds, bytes.Clone(cdb))
	if f := l.senseOnce; f != nil {
		l.senseOnce = nil
		status, sense = checkCondition(f.Key, f.ASC, f.ASCQ)
		return status, sense, nil
	}
	if f := l.failReads; f != nil && cdb[0] == scsiRead16 {
		status, sense = checkCondition(f.Key, f.ASC, f.ASCQ)
		return status, sense, nil
	}
	if l.refuse[cdb[0]] {
		status, sense = checkCondition(keyIllegalRequest, 0x20, 0)
		return status, sense, nil
	}
	lba, n := int(binary.BigEndian.Uint64(cdb[2:])), int(binary.BigEndian.Uint32(cdb[10:]))
	blocks := func() []byte { return l.disk[lba*fakeBlock : (lba+n)*fakeBlock] }
	switch cdb[0] {
	case scsiInquiry:
		if cdb[1]&cdbEVPD == 0 {
			in = make([]byte, 96)
			in[0] = l.devType
			copy(in[8:], "TIERBLK FAKE            ")
			return statusGood, nil, in
		}
		switch cdb[2] {
		case vpdSupported:
			in = []byte{0, 0, 0, 1, vpdSupported}
			if l.blockLimits != nil {
				in = append(in, vpdBlockLimits)
			}
			if l.provisioning != 0 {
				in = append(in, vpdProvisioning)
			}
			in[3] = byte(len(in) - 4)
		case vpdBlockLimits:
			in = l.blockLimits
		case vpdProvisioning:
			in = []byte{0, vpdProvisioning, 0, 4, 0, l.provisioning, 0, 0}
		}
	case scsiTestUnitReady, scsiSyncCache16, scsiSyncCache10:
	case scsiServiceIn16:
		in = make([]byte, 32)
		binary.BigEndian.PutUint64(in, uint64(len(l.disk)/fakeBlock-1))
		binary.BigEndian.PutUint32(in[8:], fakeBlock)
	case scsiModeSense6:
		in = []byte{3, 0, l.deviceParam, 0}
	case scsiRead16:
		in = blocks()
	case scsiWrite16, scsiWriteSame16:
		if f := l.failWrites; f != nil {
			status, sense = checkCondition(f.Key, f.ASC, f.ASCQ)
			return status, sense, nil
		}
		if cdb[0] == scsiWrite16 {
			copy(blocks(), out)
			break
		}
		if cdb[1]&cdbUnmapBit != 0 && l.refuseUnmap {
			status, sense = checkCondition(keyIllegalRequest, 0x24, 0)
			return status, sense, nil
		}
		for b := range n {
			copy(l.disk[(lba+b)*fakeBlock:], out)
		}
	case scsiUnmap:
		for d := out[8:]; len(d) >= 16; d = d[16:] {
			lba, n := int(binary.BigEndian.Uint64(d)), int(binary.BigEndian.Uint32(d[8:]))
			clear(l.disk[lba*fakeBlock : (lba+n)*fakeBlock])
		}
	default:
		status, sense = checkCondition(keyIllegalRequest, 0x20, 0)
	}
	return status, sense, in
}

// take returns the CDBs run so far, and forgets them.
func (l *fakeLUN) take() [][]byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	cmds := l.cmds
	l.cmds = nil
	return cmds
}

// commands returns the opcodes run so far, and forgets them.
func (l *fakeLUN) commands() []byte {
	var ops []byte
	for _, c := range l.take() {
		ops = append(ops, c[0])
	}
	return ops
}

// fakeParams have the target ask for every byte of a write beyond the immediate data.
var fakeParams = params{maxRecvData: 8192, maxSendData: 4096, maxBurst: 16384, firstBurst: 8192,
	initialR2T: true, immediateData: true, maxOutstandingR2T: 1}

// serveLUN is the target's side of a session for lun, on its own goroutine: it ends when conn
// closes or the initiator sends what it does not expect, and reports nothing (the test's checks
// are on what the backend returns and what lun recorded).
func serveLUN(conn net.Conn, lun *fakeLUN) {
	rd, wr := newPDUReader(conn, 1<<20), &pduWriter{w: conn}
	statSN, maxCmdSN := uint32(100), uint32(1000)
	send := func(h bhs, status bool, data []byte) error {
		if status {
			h.setU32(24, statSN)
			statSN++
		}
		h.setU32(28, 1)
		h.setU32(32, maxCmdSN)
		maxCmdSN++
		return wr.write(&h, data)
	}
	for {
		hp, err := rd.next()
		if err != nil {
			return
		}
		req := *hp
		data, err := rd.readData()
		if err != nil {
			return
		}
		switch req.opcode() {
		case opNOPOut, opLogoutReq:
			op := byte(opNOPIn)
			if req.opcode() == opLogoutReq {
				op = opLogoutResp
			}
			if send(reply(op, flagFinal, req), true, nil) != nil {
				return
			}
			continue
		case opSCSICmd:
		default:
			return
		}
		edtl := int(req.u32(20))
		var out []byte
		if req.flags()&flagWrite != 0 {
			out = append(out, data...)
			if len(out) < edtl { // one R2T for the rest: the backend's commands fit MaxBurstLength
				r := reply(opR2T, flagFinal, req)
				r.setTTT(1)
				r.setU32(40, uint32(len(out)))
				r.setU32(44, uint32(edtl-len(out)))
				if send(r, false, nil) != nil {
					return
				}
				for len(out) < edtl {
					if _, err := rd.next(); err != nil {
						return
					}
					d, err := rd.readData()
					if err != nil {
						return
					}
					out = append(out, d...)
				}
			}
		}
		status, sense, in := lun.handle(req[32:48], out)
		if status == statusGood && req.flags()&flagRead != 0 {
			in = in[:min(len(in), edtl)]
			for off := 0; ; off += fakeParams.maxRecvData {
				chunk := in[off:min(len(in), off+fakeParams.maxRecvData)]
				last := off+len(chunk) == len(in)
				h := dataIn(req, uint32(off/fakeParams.maxRecvData), uint32(off), -1)
				if last {
					h = dataIn(req, uint32(off/fakeParams.maxRecvData), uint32(off), statusGood)
				}
				if send(h, last, chunk) != nil {
					return
				}
				if last {
					break
				}
			}
			continue
		}
		resp := reply(opSCSIResp, flagFinal, req)
		resp[3] = status
		var seg []byte
		if len(sense) > 0 {
			seg = append([]byte{0, byte(len(sense))}, sense...)
		}
		if send(resp, true, seg) != nil {
			return
		}
	}
}

// openFake opens a backend on lun, probing it as a real one would be.
func openFake(t *testing.T, lun *fakeLUN) (*Backend, error) {
	bk, _, err := openFakeLink(t, lun, time.Minute)
	return bk, err
}

// fakeLinks hands out the connections of a backend on a fake LUN, a new one each time the backend
// logs in; a test drops the current one, as a target that restarts would.
type fakeLinks struct {
	mu      sync.Mutex
	lun     *fakeLUN
	targets []net.Conn // the target's ends, the last one current
	refuse  bool       // fail logins, as a target that is away
}

func (f *fakeLinks) connect() (*session, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.refuse {
		return nil, syscall.ECONNREFUSED
	}
	a, b := net.Pipe()
	f.targets = append(f.targets, b)
	go serveLUN(b, f.lun)
	return newSession(a, &loginResult{params: fakeParams, cmdSN: 1, expCmdSN: 1, maxCmdSN: 32, expStatSN: 100},
		1, "iqn.2026-01.test:fake at pipe", testLog, quietTiming), nil
}

// drop closes the current connection from the target's end.
func (f *fakeLinks) drop() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.targets[len(f.targets)-1].Close()
}

func (f *fakeLinks) setRefuse(refuse bool) {
	f.mu.Lock()
	f.refuse = refuse
	f.mu.Unlock()
}

func openFakeLink(t *testing.T, lun *fakeLUN, maxWait time.Duration) (*Backend, *fakeLinks, error) {
	f := &fakeLinks{lun: lun}
	s, _ := f.connect()
	bk, err := newBackend(s, 1, backend.Options{}, f.connect, maxWait, testLog)
	if err != nil {
		s.close()
		return nil, nil, err
	}
	t.Cleanup(func() {
		bk.Close()
		f.mu.Lock()
		defer f.mu.Unlock()
		for _, c := range f.targets {
			c.Close()
		}
	})
	lun.commands() // the probe's
	return bk, f, nil
}

func newFakeLUN(size int) *fakeLUN {
	return &fakeLUN{disk: make([]byte, size), refuse: map[byte]bool{}}
}

// A LUN without FUA, SYNCHRONIZE CACHE(16), WRITE SAME or provisioning: FUA writes flush, flush
// falls back to SYNCHRONIZE CACHE(10) for good, write-zeroes and trim are not supported.
func TestBackendWithoutAbilities(t *testing.T) {
	lun := newFakeLUN(1 << 20)
	lun.refuse[scsiSyncCache16] = true
	lun.refuse[scsiWriteSame16] = true
	b, err := openFake(t, lun)
	require.NoError(t, err)

	_, err = b.WriteAtFUA(bytes.Repeat([]byte{7}, 4096), 8192)
	require.NoError(t, err)
	require.Equal(t, []byte{scsiWrite16, scsiSyncCache16, scsiSyncCache10}, lun.commands(), "FUA without DPOFUA: write, then flush")
	require.Equal(t, bytes.Repeat([]byte{7}, 4096), lun.disk[8192:12288])
	require.NoError(t, b.Flush())
	require.Equal(t, []byte{scsiSyncCache10}, lun.commands(), "SYNCHRONIZE CACHE(16) is not tried again")

	err = b.WriteZeroes(0, 8192, true)
	require.ErrorIs(t, err, backend.ErrNotSupported)
	require.Equal(t, []byte{scsiWriteSame16}, lun.commands())
	require.ErrorIs(t, b.WriteZeroes(0, 8192, false), backend.ErrNotSupported)
	require.Empty(t, lun.commands(), "WRITE SAME is not tried again")

	require.ErrorIs(t, b.Trim(0, 8192), backend.ErrNotSupported)
	require.Empty(t, lun.commands())
}

// A LUN with every ability: FUA in the write, UNMAP split by the LUN's limits, WRITE SAME with
// UNMAP where unmapped blocks read as zeroes, and without it once the LUN refuses the bit.
func TestBackendWithAbilities(t *testing.T) {
	lun := newFakeLUN(1 << 20)
	lun.deviceParam = 0x10 // DPOFUA
	lun.provisioning = 0xe4
	lun.blockLimits = make([]byte, 64)
	binary.BigEndian.PutUint32(lun.blockLimits[8:], 4)   // maximum transfer: 4 blocks
	binary.BigEndian.PutUint32(lun.blockLimits[20:], 8)  // maximum unmap LBA count
	binary.BigEndian.PutUint32(lun.blockLimits[24:], 2)  // maximum unmap descriptors
	binary.BigEndian.PutUint64(lun.blockLimits[36:], 16) // maximum WRITE SAME length
	b, err := openFake(t, lun)
	require.NoError(t, err)
	require.Equal(t, int64(4), b.cmdBlocks)

	pattern := bytes.Repeat([]byte("0123456789abcdef"), 640) // 10240 bytes: 20 blocks
	_, err = b.WriteAtFUA(pattern, 0)
	require.NoError(t, err)
	cmds := lun.take()
	require.Len(t, cmds, 5, "20 blocks, 4 at a time")
	for _, c := range cmds {
		require.Equal(t, byte(scsiWrite16), c[0])
		require.Equal(t, byte(cdbFUA), c[1], "the FUA bit, no flush")
	}
	got := make([]byte, len(pattern)-3)
	_, err = b.ReadAt(got, 3)
	require.NoError(t, err)
	require.Equal(t, pattern[3:], got)
	require.Len(t, lun.commands(), 5)

	// Blocks 1 to 20 whole; the 100 bytes of block 0 and the end of block 21 are left.
	lun.disk = bytes.Repeat([]byte{1}, len(lun.disk))
	require.NoError(t, b.Trim(412, 20*fakeBlock+200))
	require.Equal(t, []byte{scsiUnmap, scsiUnmap}, lun.commands(), "20 blocks: 8+8 in one UNMAP, 4 in a second")
	require.Equal(t, bytes.Repeat([]byte{1}, fakeBlock), lun.disk[:fakeBlock])
	require.Equal(t, make([]byte, 20*fakeBlock), lun.disk[fakeBlock:21*fakeBlock])
	require.Equal(t, byte(1), lun.disk[21*fakeBlock])

	lun.disk = bytes.Repeat([]byte{1}, len(lun.disk))
	require.NoError(t, b.WriteZeroes(fakeBlock, 32*fakeBlock, true))
	cmds = lun.take()
	require.Len(t, cmds, 2, "32 blocks, 16 at a time")
	require.Equal(t, byte(cdbUnmapBit), cmds[0][1]&cdbUnmapBit)
	require.Equal(t, make([]byte, 32*fakeBlock), lun.disk[fakeBlock:33*fakeBlock])

	lun.refuseUnmap = true
	require.NoError(t, b.WriteZeroes(0, 16*fakeBlock, true))
	require.Equal(t, []byte{scsiWriteSame16, scsiWriteSame16}, lun.commands(), "refused with UNMAP, then without")
	require.NoError(t, b.WriteZeroes(0, 16*fakeBlock, true))
	require.Equal(t, []byte{scsiWriteSame16}, lun.commands(), "UNMAP not asked again")
	require.NoError(t, b.WriteZeroes(0, 16*fakeBlock, false))
	require.Zero(t, lun.take()[0][1]&cdbUnmapBit)
}

func TestBackendErrors(t *testing.T) {
	t.Run("write-protected LUN", func(t *testing.T) {
		lun := newFakeLUN(1 << 20)
		lun.deviceParam = 0x80
		b, err := openFake(t, lun)
		require.NoError(t, err)
		require.True(t, b.ReadOnly())
		_, err = b.WriteAt(make([]byte, 512), 0)
		require.ErrorIs(t, err, backend.ErrReadOnly)
		require.Empty(t, lun.commands(), "refused without asking")
	})
	for _, c := range []struct {
		name  string
		sense Sense
		is    error
		msg   string
	}{
		{"write protected", Sense{Key: keyDataProtect, ASC: 0x27}, backend.ErrReadOnly,
			"WRITE(16) of 1 blocks at LBA 0: CHECK CONDITION, DATA PROTECT: write protected"},
		{"thin LUN out of space", Sense{Key: keyDataProtect, ASC: 0x27, ASCQ: 0x07}, syscall.ENOSPC,
			"space allocation failed write protect"},
		{"medium error", Sense{Key: 0x3, ASC: 0x0c}, nil, "MEDIUM ERROR: write error (ASC 0x0c ASCQ 0x00)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			lun := newFakeLUN(1 << 20)
			b, err := openFake(t, lun)
			require.NoError(t, err)
			lun.failWrites = &c.sense
			_, err = b.WriteAt(make([]byte, 512), 0)
			require.ErrorContains(t, err, c.msg)
			if c.is != nil {
				require.ErrorIs(t, err, c.is)
			}
			var serr *SCSIError
			require.ErrorAs(t, err, &serr)
		})
	}
	t.Run("not a disk", func(t *testing.T) {
		lun := newFakeLUN(1 << 20)
		lun.devType = 0x05
		_, err := openFake(t, lun)
		require.ErrorIs(t, err, errNotDisk)
		require.ErrorContains(t, err, "LUN 1 of iqn.2026-01.test:fake at pipe is not a disk (peripheral qualifier 0, device type 0x05)")
	})
	t.Run("no such LUN", func(t *testing.T) {
		lun := newFakeLUN(1 << 20)
		lun.devType = 0x7f
		_, err := openFake(t, lun)
		require.ErrorContains(t, err, "iqn.2026-01.test:fake at pipe has no LUN 1")
	})
	t.Run("closed", func(t *testing.T) {
		b, err := openFake(t, newFakeLUN(1<<20))
		require.NoError(t, err)
		require.NoError(t, b.Close())
		_, err = b.ReadAt(make([]byte, 512), 0)
		require.ErrorIs(t, err, backend.ErrClosed)
		require.NoError(t, b.Close(), "a second Close")
	})
}

// readAsync runs ReadAtAsync and waits for its end; started is false where it was not started.
func readAsync(t *testing.T, b *Backend, p []byte, off int64) (started bool, err error) {
	t.Helper()
	done := make(chan error, 1)
	if !b.ReadAtAsync(p, off, func(err error) { done <- err }) {
		return false, nil
	}
	select {
	case err := <-done:
		return true, err
	case <-time.After(10 * time.Second):
		t.Fatal("an asynchronous read never ended")
		return true, nil
	}
}

// ReadAtAsync starts what one READ(16) moves; what needs more (partial blocks, several commands)
// is left to ReadAt. What the target answers other than GOOD, and a session lost under the read,
// end it through the plain path: the retry of a UNIT ATTENTION, the reissue on a new session, the
// error of a failed read.
func TestBackendReadAsync(t *testing.T) {
	lun := newFakeLUN(1 << 20)
	for i := range lun.disk {
		lun.disk[i] = byte(i / fakeBlock)
	}
	b, links, err := openFakeLink(t, lun, time.Minute)
	require.NoError(t, err)
	want := func(off, n int) []byte { return lun.disk[off : off+n] }

	p := make([]byte, 4096)
	started, err := readAsync(t, b, p, 8192)
	require.True(t, started)
	require.NoError(t, err)
	require.Equal(t, want(8192, 4096), p)
	require.Equal(t, []byte{scsiRead16}, lun.commands())

	for _, c := range []struct {
		name string
		off  int64
		n    int
	}{
		{"partial block", 100, 512},
		{"not whole blocks", 512, 1000},
		{"more than one command", 0, fakeParams.maxBurst + fakeBlock},
		{"beyond the end", 1 << 20, 512},
		{"empty", 0, 0},
	} {
		started, _ := readAsync(t, b, make([]byte, c.n), c.off)
		require.False(t, started, c.name)
	}
	require.Empty(t, lun.commands(), "nothing sent for what was not started")

	// A UNIT ATTENTION: retried, by the plain path.
	ua := &Sense{Key: keyUnitAttention, ASC: 0x29}
	lun.mu.Lock()
	lun.senseOnce = ua
	lun.mu.Unlock()
	clear(p)
	started, err = readAsync(t, b, p, 0)
	require.True(t, started)
	require.NoError(t, err)
	require.Equal(t, want(0, 4096), p)
	require.Equal(t, []byte{scsiRead16, scsiRead16}, lun.commands())

	// The session lost under the read: run again on the next one.
	onCommand(lun, scsiRead16, func() bool { links.drop(); return false })
	clear(p)
	started, err = readAsync(t, b, p, 4096)
	require.True(t, started)
	require.NoError(t, err)
	require.Equal(t, want(4096, 4096), p)
	require.EqualValues(t, 1, b.l.reconnects.Load())

	// A medium error: the read fails with it.
	lun.mu.Lock()
	lun.failReads = &Sense{Key: 0x3, ASC: 0x11} // MEDIUM ERROR, unrecovered read error
	lun.mu.Unlock()
	_, err = readAsync(t, b, p, 0)
	require.ErrorContains(t, err, "MEDIUM ERROR")
}

// WriteAtAsync starts a write whose data fits in its command's PDU, with FUA where the LUN honours
// it; a failed status ends it through the plain path, with its error.
func TestBackendWriteAsync(t *testing.T) {
	lun := newFakeLUN(1 << 20)
	lun.deviceParam = 0x10 // DPOFUA
	b, _, err := openFakeLink(t, lun, time.Minute)
	require.NoError(t, err)
	write := func(p []byte, off int64, fua bool) (bool, error) {
		done := make(chan error, 1)
		if !b.WriteAtAsync(p, off, fua, func(err error) { done <- err }) {
			return false, nil
		}
		return true, <-done
	}
	started, err := write(bytes.Repeat([]byte{5}, 4096), 4096, true)
	require.True(t, started)
	require.NoError(t, err)
	require.Equal(t, bytes.Repeat([]byte{5}, 4096), lun.disk[4096:8192])
	cmds := lun.take()
	require.Len(t, cmds, 1)
	require.Equal(t, []byte{scsiWrite16, cdbFUA}, cmds[0][:2], "one WRITE(16) with FUA")

	started, _ = write(make([]byte, fakeParams.maxSendData+fakeBlock), 0, false)
	require.False(t, started, "more than one PDU of data")
	started, _ = write(make([]byte, 100), 0, false)
	require.False(t, started, "a partial block")

	lun.mu.Lock()
	lun.failWrites = &Sense{Key: 0x3, ASC: 0x0c} // MEDIUM ERROR, write error
	lun.mu.Unlock()
	started, err = write(make([]byte, 512), 0, false)
	require.True(t, started)
	require.ErrorContains(t, err, "MEDIUM ERROR")
}

// Reads started plugged go at Unplug and end with their data; a done may defer work to the end of
// the reader's run (AtRunEnd), which runs after it. Reads held in a session that is lost before
// Unplug run again on the next one.
func TestBackendPluggedReads(t *testing.T) {
	lun := newFakeLUN(1 << 20)
	for i := range lun.disk {
		lun.disk[i] = byte(i / fakeBlock)
	}
	b, links, err := openFakeLink(t, lun, time.Minute)
	require.NoError(t, err)
	const n = 6
	read := func(drop bool) {
		t.Helper()
		bufs := make([][]byte, n)
		ended := make(chan int, n)
		atEnd := make(chan int, n)
		b.Plug()
		for i := range n {
			bufs[i] = make([]byte, 4096)
			require.True(t, b.ReadAtAsync(bufs[i], int64(8192*i), func(err error) {
				require.NoError(t, err)
				ended <- i
				if !b.AtRunEnd(func() { atEnd <- i }) {
					atEnd <- -1 // ended off the reader (the plain path's retry)
				}
			}))
		}
		require.Empty(t, lun.commands(), "held while plugged")
		if drop {
			links.drop()
		}
		b.Unplug()
		for range n {
			select {
			case <-ended:
			case <-time.After(10 * time.Second):
				t.Fatal("a plugged read never ended")
			}
		}
		for i := range n {
			require.Equal(t, lun.disk[8192*i:8192*i+4096], bufs[i], "read %d", i)
		}
		deferred := 0
		for range n {
			if <-atEnd >= 0 {
				deferred++
			}
		}
		if !drop {
			require.Equal(t, n, deferred, "each done's deferred call ran at its run's end")
		}
	}
	read(false)
	require.Equal(t, bytes.Repeat([]byte{scsiRead16}, n), lun.commands())
	read(true)
	require.EqualValues(t, 1, b.l.reconnects.Load())
}
