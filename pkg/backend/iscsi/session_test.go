package iscsi

import (
	"bytes"
	"encoding/binary"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/pkg/backend"
)

// testParams are small limits, so that a few kilobytes cross every boundary.
var testParams = params{maxRecvData: 8192, maxSendData: 4096, maxBurst: 16384, firstBurst: 8192,
	immediateData: true, maxOutstandingR2T: 1}

// quietTiming keeps the keepalive out of tests that do not test it.
var quietTiming = timing{tick: time.Hour, pingAfter: time.Hour, deadAfter: time.Hour, logout: 50 * time.Millisecond, command: time.Hour}

// startSession connects a session in full feature phase to a fake target.
func startSession(t *testing.T, p params, tm timing) (*session, *fakeTarget) {
	a, b := net.Pipe()
	f := newFakeTarget(t, b)
	f.rd.headerDigest, f.rd.dataDigest = p.headerDigest, p.dataDigest
	f.wr.headerDigest, f.wr.dataDigest = p.headerDigest, p.dataDigest
	res := &loginResult{params: p, cmdSN: 1, expCmdSN: f.expCmdSN, maxCmdSN: f.maxCmdSN, expStatSN: f.statSN}
	s := newSession(a, res, 1, "iqn.2026-01.test:fake at pipe", testLog, tm)
	t.Cleanup(func() {
		b.Close() // first, so that close's logout finds no one rather than waiting
		s.close()
	})
	return s, f
}

type cmdResult struct {
	t   *task
	err error
}

// goCommand runs a command on its own goroutine, as a backend's caller would.
func goCommand(s *session, cdb []byte, read, write []byte) chan cmdResult {
	c := make(chan cmdResult, 1)
	go func() {
		t, err := s.command(cdb, read, write)
		c <- cmdResult{t, err}
	}()
	return c
}

func wait(t *testing.T, c chan cmdResult) cmdResult {
	t.Helper()
	select {
	case r := <-c:
		return r
	case <-time.After(5 * time.Second):
		t.Fatal("command did not complete")
		return cmdResult{}
	}
}

// dataIn is a Data-In of the command req, with the status in it when status >= 0.
func dataIn(req bhs, dataSN, off uint32, status int) bhs {
	h := reply(opDataIn, 0, req)
	h.setU32(36, dataSN)
	h.setU32(40, off)
	if status >= 0 {
		h[1] = flagFinal | flagStatus
		h[3] = byte(status)
	}
	return h
}

func TestSessionRead(t *testing.T) {
	s, f := startSession(t, testParams, quietTiming)
	want := bytes.Repeat([]byte("0123456789"), 1000)
	buf := make([]byte, len(want))
	res := goCommand(s, cdbBlocks(scsiRead16, 0, 5, 20), buf, nil)
	req, data := f.recvOp(opSCSICmd)
	require.Empty(t, data)
	require.Equal(t, byte(flagFinal|flagRead|attrSimple), req.flags())
	require.Equal(t, uint64(1)<<48, req.lun(), "LUN 1, peripheral addressing")
	require.Equal(t, uint32(len(want)), req.u32(20), "expected data transfer length")
	require.Equal(t, uint32(1), req.u32(24), "CmdSN")
	require.Equal(t, uint32(100), req.u32(28), "ExpStatSN")
	require.Equal(t, cdbBlocks(scsiRead16, 0, 5, 20), req[32:48])

	f.send(dataIn(req, 0, 0, -1), want[:4096])
	f.send(dataIn(req, 1, 4096, -1), want[4096:8192])
	f.sendStatus(dataIn(req, 2, 8192, statusGood), want[8192:])
	r := wait(t, res)
	require.NoError(t, r.err)
	require.Equal(t, statusGood, int(r.t.status))
	require.Equal(t, len(want), r.t.got)
	require.Equal(t, want, buf)

	// A second command carries the next CmdSN and acknowledges the status.
	res = goCommand(s, make([]byte, 6), nil, nil)
	req, _ = f.recvOp(opSCSICmd)
	require.Equal(t, uint32(2), req.u32(24), "CmdSN")
	require.Equal(t, uint32(101), req.u32(28), "ExpStatSN")
	f.sendStatus(reply(opSCSIResp, flagFinal, req), nil)
	require.NoError(t, wait(t, res).err)
}

// A status in a separate SCSI Response, with sense data.
func TestSessionCheckCondition(t *testing.T) {
	s, f := startSession(t, testParams, quietTiming)
	buf := make([]byte, 512)
	res := goCommand(s, cdbBlocks(scsiRead16, 0, 0, 1), buf, nil)
	req, _ := f.recvOp(opSCSICmd)
	f.send(dataIn(req, 0, 0, -1), make([]byte, 100))
	resp := reply(opSCSIResp, flagFinal|0x02, req) // U: residual underflow
	resp[3] = statusCheckCondition
	resp.setU32(44, 412)
	sense := []byte{0x70, 0, 0x03, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0x11, 0x00, 0, 0, 0, 0}
	f.sendStatus(resp, append([]byte{0, byte(len(sense))}, sense...))
	r := wait(t, res)
	require.NoError(t, r.err)
	require.Equal(t, statusCheckCondition, int(r.t.status))
	require.Equal(t, sense, r.t.sense)
	require.Equal(t, 100, r.t.got)
}

// recvData reads Data-Out PDUs for one sequence of the write req until its final bit, checks their
// fields and returns where each went.
func recvData(t *testing.T, f *fakeTarget, req bhs, ttt uint32, off int, into []byte) int {
	t.Helper()
	for sn := uint32(0); ; sn++ {
		h, d := f.recvOp(opDataOut)
		require.Equal(t, req.itt(), h.itt())
		require.Equal(t, ttt, h.ttt())
		require.Equal(t, sn, h.dataSN())
		require.Equal(t, uint32(off), h.bufferOffset())
		require.LessOrEqual(t, len(d), testParams.maxSendData)
		copy(into[off:], d)
		off += len(d)
		if h.flags()&flagFinal != 0 {
			return off
		}
	}
}

func TestSessionWrite(t *testing.T) {
	want := make([]byte, 20000)
	for i := range want {
		want[i] = byte(i * 7)
	}
	for _, c := range []struct {
		name                     string
		immediate, initialR2T    bool
		wantImmediate, wantUnsol int   // where immediate data and unsolicited Data-Out end
		r2ts                     []int // the R2Ts the target sends, one after the other
	}{
		{name: "immediate and unsolicited data, then R2T", immediate: true, wantImmediate: 4096, wantUnsol: 8192,
			r2ts: []int{11808}},
		{name: "immediate data only (InitialR2T=Yes), two R2Ts", immediate: true, initialR2T: true, wantImmediate: 4096,
			wantUnsol: 4096, r2ts: []int{12000, 3904}},
		{name: "unsolicited Data-Out only", wantUnsol: 8192, r2ts: []int{11808}},
		{name: "all solicited", initialR2T: true, r2ts: []int{16384, 3616}},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := testParams
			p.immediateData, p.initialR2T = c.immediate, c.initialR2T
			s, f := startSession(t, p, quietTiming)
			res := goCommand(s, cdbBlocks(scsiWrite16, 0, 0, 40), nil, want)
			req, imm := f.recvOp(opSCSICmd)
			require.Equal(t, byte(flagWrite|attrSimple), req.flags()&^flagFinal)
			require.Equal(t, c.wantUnsol == c.wantImmediate, req.flags()&flagFinal != 0, "F: no unsolicited Data-Out follows")
			require.Equal(t, uint32(len(want)), req.u32(20))
			require.Len(t, imm, c.wantImmediate)
			got := make([]byte, len(want))
			copy(got, imm)
			off := len(imm)
			if c.wantUnsol > c.wantImmediate {
				off = recvData(t, f, req, reservedTag, off, got)
				require.Equal(t, c.wantUnsol, off, "unsolicited data ends at FirstBurstLength")
			}
			for i, n := range c.r2ts {
				r := reply(opR2T, flagFinal, req)
				r.setTTT(0x55 + uint32(i))
				r.setU32(24, f.statSN) // the next StatSN, not taken
				r.setU32(36, uint32(i))
				r.setU32(40, uint32(off))
				r.setU32(44, uint32(n))
				f.send(r, nil)
				require.Equal(t, off+n, recvData(t, f, req, 0x55+uint32(i), off, got))
				off += n
			}
			require.Equal(t, len(want), off)
			f.sendStatus(reply(opSCSIResp, flagFinal, req), nil)
			require.NoError(t, wait(t, res).err)
			require.Equal(t, want, got)
		})
	}
}

// Many commands in flight, answered in reverse order: each gets its own data.
func TestSessionManyInFlight(t *testing.T) {
	s, f := startSession(t, testParams, quietTiming)
	const n = 20
	bufs := make([][]byte, n)
	results := make([]chan cmdResult, n)
	for i := range n {
		bufs[i] = make([]byte, 1000)
		results[i] = goCommand(s, cdbBlocks(scsiRead16, 0, uint64(i), 2), bufs[i], nil)
	}
	reqs := map[uint64]bhs{}
	cmdSNs := map[uint32]bool{}
	for range n {
		req, _ := f.recvOp(opSCSICmd)
		reqs[binary.BigEndian.Uint64(req[34:])] = req
		cmdSNs[req.u32(24)] = true
	}
	for sn := uint32(1); sn <= n; sn++ {
		require.True(t, cmdSNs[sn], "CmdSN %d", sn)
	}
	for i := n - 1; i >= 0; i-- {
		f.sendStatus(dataIn(reqs[uint64(i)], 0, 0, statusGood), bytes.Repeat([]byte{byte(i)}, 1000))
	}
	for i := range n {
		require.NoError(t, wait(t, results[i]).err)
		require.Equal(t, bytes.Repeat([]byte{byte(i)}, 1000), bufs[i], "command %d", i)
	}
}

// Commands wait while the target's window is closed, and go when a NOP-In opens it.
func TestSessionCommandWindow(t *testing.T) {
	s, f := startSession(t, testParams, quietTiming)
	f.maxCmdSN = 1
	s.mu.Lock()
	s.maxCmdSN = 1 // room for CmdSN 1 only
	s.mu.Unlock()
	first := goCommand(s, make([]byte, 6), nil, nil)
	req1, _ := f.recvOp(opSCSICmd)
	second := goCommand(s, make([]byte, 6), nil, nil)
	f.quiet(100 * time.Millisecond)
	f.expCmdSN = 2
	f.sendStatus(reply(opSCSIResp, flagFinal, req1), nil) // the window stays closed: MaxCmdSN 1
	require.NoError(t, wait(t, first).err)
	f.quiet(100 * time.Millisecond)
	f.maxCmdSN = 2
	nop := reply(opNOPIn, flagFinal, bhs{})
	nop.setITT(reservedTag)
	nop.setU32(24, f.statSN)
	f.send(nop, nil)
	req2, _ := f.recvOp(opSCSICmd)
	require.Equal(t, uint32(2), req2.u32(24))
	f.sendStatus(reply(opSCSIResp, flagFinal, req2), nil)
	require.NoError(t, wait(t, second).err)
}

// The target's ping is answered with its tag and data, without taking a CmdSN.
func TestSessionAnswersTargetPing(t *testing.T) {
	_, f := startSession(t, testParams, quietTiming)
	nop := reply(opNOPIn, flagFinal, bhs{})
	nop.setITT(reservedTag)
	nop.setTTT(0x77)
	nop.setLUN(1 << 48)
	nop.setU32(24, f.statSN)
	f.send(nop, []byte("ping"))
	out, data := f.recvOp(opNOPOut)
	require.NotZero(t, out[0]&bitImmediate)
	require.Equal(t, uint32(reservedTag), out.itt())
	require.Equal(t, uint32(0x77), out.ttt())
	require.Equal(t, uint64(1<<48), out.lun())
	require.Equal(t, uint32(1), out.u32(24), "CmdSN, not advanced")
	require.Equal(t, "ping", string(data))
}

// An idle session pings the target, and gives up a target that stops answering.
func TestSessionKeepalive(t *testing.T) {
	s, f := startSession(t, testParams, timing{tick: 10 * time.Millisecond, pingAfter: 50 * time.Millisecond,
		deadAfter: 400 * time.Millisecond, logout: 50 * time.Millisecond, command: time.Hour})
	ping, _ := f.recvOp(opNOPOut)
	require.NotEqual(t, uint32(reservedTag), ping.itt())
	require.Equal(t, uint32(reservedTag), ping.ttt())
	f.sendStatus(reply(opNOPIn, flagFinal, ping), nil)
	f.recvOp(opNOPOut) // the next one, once idle again: not answered
	select {
	case <-s.done:
	case <-time.After(5 * time.Second):
		t.Fatal("a silent target was not given up")
	}
	_, err := s.command(make([]byte, 6), nil, nil)
	require.ErrorContains(t, err, "sent nothing for")
}

// A command the target never answers ends the session after timing.command, however lively the
// connection, so that the backend runs it again on a new one.
func TestSessionCommandTimeout(t *testing.T) {
	s, f := startSession(t, testParams, timing{tick: 10 * time.Millisecond, pingAfter: time.Hour,
		deadAfter: time.Hour, logout: 50 * time.Millisecond, command: 300 * time.Millisecond})
	res := goCommand(s, cdbBlocks(scsiRead16, 0, 8, 1), make([]byte, 512), nil)
	f.recvOp(opSCSICmd) // never answered
	r := wait(t, res)
	require.ErrorContains(t, r.err, "did not answer READ(16) of 1 blocks at LBA 8 in 300ms")
	var ended *endedError
	require.ErrorAs(t, r.err, &ended, "to be run again on a new session")
}

// What a target sends that breaks the protocol ends the session with an error saying what it was:
// the command in flight and every later one fail with it, and nothing panics.
func TestSessionHostileTarget(t *testing.T) {
	header := func(op byte, itt uint32, dataLen int) []byte {
		var h bhs
		h.setOpcode(op, false)
		h.setITT(itt)
		h.setDataLen(dataLen)
		return h[:]
	}
	cases := []struct {
		name  string
		write bool // the command in flight writes 4096 bytes; else it reads 4096
		act   func(f *fakeTarget, req bhs)
		msg   string
	}{
		{name: "data segment over MaxRecvDataSegmentLength", act: func(f *fakeTarget, req bhs) {
			f.raw(header(opDataIn, req.itt(), 8193))
		}, msg: "DataSegmentLength over the negotiated MaxRecvDataSegmentLength: SCSI Data-In"},
		{name: "16 MiB data segment", act: func(f *fakeTarget, req bhs) {
			f.raw(header(opSCSIResp, req.itt(), maxDataLen))
		}, msg: "16777215 bytes, limit 8192"},
		{name: "PDU cut short", act: func(f *fakeTarget, req bhs) {
			f.raw(header(opDataIn, req.itt(), 100)[:30])
			f.conn.Close()
		}, msg: "iscsi: connection to iqn.2026-01.test:fake at pipe"},
		{name: "data cut short", act: func(f *fakeTarget, req bhs) {
			f.raw(append(dataInHeader(req, 0, 0, 100), make([]byte, 10)...))
			f.conn.Close()
		}, msg: "cut short in its data"},
		{name: "unknown ITT", act: func(f *fakeTarget, req bhs) {
			h := dataIn(req, 0, 0, -1)
			h.setITT(req.itt() + 1000)
			f.send(h, make([]byte, 10))
		}, msg: "SCSI Data-In (ITT 0x"},
		{name: "Data-In beyond the buffer", act: func(f *fakeTarget, req bhs) {
			f.send(dataIn(req, 0, 0, -1), make([]byte, 4100))
		}, msg: "brings 4100 bytes at offset 0, beyond the 4096 asked for"},
		{name: "Data-In out of order", act: func(f *fakeTarget, req bhs) {
			f.send(dataIn(req, 0, 2048, -1), make([]byte, 100))
		}, msg: "at buffer offset 2048, expected 0"},
		{name: "Data-In with a wrong DataSN", act: func(f *fakeTarget, req bhs) {
			f.send(dataIn(req, 0, 0, -1), make([]byte, 100))
			f.send(dataIn(req, 5, 100, -1), make([]byte, 100))
		}, msg: "has DataSN 5, expected 1"},
		{name: "status without the final bit", act: func(f *fakeTarget, req bhs) {
			h := dataIn(req, 0, 0, statusGood)
			h[1] = flagStatus
			f.sendStatus(h, nil)
		}, msg: "carries a status without the final bit"},
		{name: "wrong StatSN", act: func(f *fakeTarget, req bhs) {
			f.statSN += 3
			f.sendStatus(reply(opSCSIResp, flagFinal, req), nil)
		}, msg: "has StatSN 103, expected 100"},
		{name: "sense length past the data", act: func(f *fakeTarget, req bhs) {
			f.sendStatus(reply(opSCSIResp, flagFinal, req), []byte{0, 200, 0x70, 0, 0})
		}, msg: "SenseLength 200 in a data segment of 5 bytes"},
		{name: "R2T for a read", act: func(f *fakeTarget, req bhs) {
			f.send(r2tFor(req, 0, 0, 512), nil)
		}, msg: "for a command that writes nothing"},
		{name: "R2T beyond the write", write: true, act: func(f *fakeTarget, req bhs) {
			f.send(r2tFor(req, 0, 4000, 512), nil)
		}, msg: "asks for 512 bytes at offset 4000 of a 4096-byte write"},
		{name: "R2T over MaxBurstLength", write: true, act: func(f *fakeTarget, req bhs) {
			f.send(r2tFor(req, 0, 0, 16385), nil)
		}, msg: "(MaxBurstLength 16384)"},
		{name: "R2T without a transfer tag", write: true, act: func(f *fakeTarget, req bhs) {
			h := r2tFor(req, 0, 0, 512)
			h.setTTT(reservedTag)
			f.send(h, nil)
		}, msg: "without a Target Transfer Tag"},
		{name: "R2T with a wrong R2TSN", write: true, act: func(f *fakeTarget, req bhs) {
			f.send(r2tFor(req, 3, 0, 512), nil)
		}, msg: "has R2TSN 3, expected 0"},
		{name: "more R2Ts than MaxOutstandingR2T", write: true, act: func(f *fakeTarget, req bhs) {
			for i := range uint32(3) { // the first may be taken at once; the initiator's Data-Out then waits on us
				f.send(r2tFor(req, i, 0, 512), nil)
			}
		}, msg: "beyond MaxOutstandingR2T=1"},
		{name: "NOP-In for no ping of ours", act: func(f *fakeTarget, req bhs) {
			f.sendStatus(reply(opNOPIn, flagFinal, req), nil)
		}, msg: "NOP-In (ITT 0x1, DataSegmentLength 0) for no such task of ours"},
		{name: "Login Response in full feature phase", act: func(f *fakeTarget, req bhs) {
			f.send(reply(opLoginResp, flagFinal, req), nil)
		}, msg: "unexpected Login Response"},
		{name: "unknown opcode", act: func(f *fakeTarget, req bhs) {
			f.send(reply(0x3a, flagFinal, req), nil)
		}, msg: "unexpected unknown opcode 0x3a"},
		{name: "Reject without the rejected header", act: func(f *fakeTarget, req bhs) {
			f.sendStatus(reply(opReject, flagFinal, bhs{}), make([]byte, 20))
		}, msg: "Reject without the rejected header (20 bytes)"},
		{name: "target drops the session", act: func(f *fakeTarget, req bhs) {
			h := reply(opAsync, flagFinal, bhs{})
			h.setITT(reservedTag)
			h[36] = 2
			f.sendStatus(h, nil)
		}, msg: "asks us to log out or is dropping the connection (asynchronous event 2)"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := testParams
			p.immediateData, p.initialR2T = false, true // a write sends data only when asked
			s, f := startSession(t, p, quietTiming)
			var res chan cmdResult
			if c.write {
				res = goCommand(s, cdbBlocks(scsiWrite16, 0, 0, 8), nil, make([]byte, 4096))
			} else {
				res = goCommand(s, cdbBlocks(scsiRead16, 0, 0, 8), make([]byte, 4096), nil)
			}
			req, _ := f.recvOp(opSCSICmd)
			// Nothing reads what the initiator sends from here on: a Data-Out it sends waits on
			// the pipe until the session ends. The initiator may hang up while we send.
			f.hostile = true
			c.act(f, req)
			r := wait(t, res)
			require.ErrorContains(t, r.err, c.msg)
			select {
			case <-s.done:
			case <-time.After(5 * time.Second):
				t.Fatal("the session did not end")
			}
			_, err := s.command(make([]byte, 6), nil, nil)
			require.ErrorContains(t, err, c.msg, "a later command")
		})
	}
}

// dataInHeader is the raw header of a Data-In carrying n bytes.
func dataInHeader(req bhs, dataSN, off uint32, n int) []byte {
	h := dataIn(req, dataSN, off, -1)
	h.setDataLen(n)
	return h[:]
}

func r2tFor(req bhs, r2tSN, off, n uint32) bhs {
	h := reply(opR2T, flagFinal, req)
	h.setTTT(0x99)
	h.setU32(36, r2tSN)
	h.setU32(40, off)
	h.setU32(44, n)
	return h
}

// A Reject fails the command it names; the session goes on.
func TestSessionReject(t *testing.T) {
	s, f := startSession(t, testParams, quietTiming)
	res := goCommand(s, make([]byte, 6), nil, nil)
	req, _ := f.recvOp(opSCSICmd)
	rej := reply(opReject, flagFinal, bhs{})
	rej.setITT(reservedTag)
	rej[2] = 0x05
	f.sendStatus(rej, req[:])
	require.ErrorContains(t, wait(t, res).err, "rejected our SCSI Command: command not supported (reason 0x05)")

	res = goCommand(s, make([]byte, 6), nil, nil)
	req, _ = f.recvOp(opSCSICmd)
	f.sendStatus(reply(opSCSIResp, flagFinal, req), nil)
	require.NoError(t, wait(t, res).err)
}

// A Data-In whose data digest is wrong fails its command only: the stream is still in step.
func TestSessionDataDigestError(t *testing.T) {
	p := testParams
	p.headerDigest, p.dataDigest = true, true
	s, f := startSession(t, p, quietTiming)
	buf := make([]byte, 8)
	res := goCommand(s, cdbBlocks(scsiRead16, 0, 0, 1), buf, nil)
	req, _ := f.recvOp(opSCSICmd)
	h := dataIn(req, 0, 0, statusGood)
	h.setU32(24, f.statSN)
	h.setU32(28, f.expCmdSN)
	h.setU32(32, f.maxCmdSN)
	f.statSN++
	wire := encode(t, h, []byte("abcdefgh"), true, true)
	wire[len(wire)-1] ^= 0xff // the data digest
	f.raw(wire)
	r := wait(t, res)
	require.ErrorIs(t, r.t.digest, errDataDigest)

	res = goCommand(s, cdbBlocks(scsiRead16, 0, 0, 1), buf, nil)
	req, _ = f.recvOp(opSCSICmd)
	f.sendStatus(dataIn(req, 0, 0, statusGood), []byte("12345678"))
	r = wait(t, res)
	require.NoError(t, r.err)
	require.Nil(t, r.t.digest)
	require.Equal(t, "12345678", string(buf))
}

// exec retries a command that met a UNIT ATTENTION or BUSY, and reports one that keeps failing.
func TestExecRetries(t *testing.T) {
	s, f := startSession(t, testParams, quietTiming)
	done := make(chan error, 1)
	go func() { _, err := s.exec(make([]byte, 6), nil, nil); done <- err }()
	ua := []byte{0, 18, 0x70, 0, keyUnitAttention, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0x29, 0, 0, 0, 0, 0}
	req, _ := f.recvOp(opSCSICmd)
	resp := reply(opSCSIResp, flagFinal, req)
	resp[3] = statusCheckCondition
	f.sendStatus(resp, ua)
	req, _ = f.recvOp(opSCSICmd)
	resp = reply(opSCSIResp, flagFinal, req)
	resp[3] = statusBusy
	f.sendStatus(resp, nil)
	req, _ = f.recvOp(opSCSICmd)
	f.sendStatus(reply(opSCSIResp, flagFinal, req), nil)
	require.NoError(t, <-done)

	go func() { _, err := s.exec(cdbBlocks(scsiWrite16, 0, 0, 1), nil, make([]byte, 512)); done <- err }()
	for range maxRetries + 1 {
		req, _ = f.recvOp(opSCSICmd)
		resp = reply(opSCSIResp, flagFinal, req)
		resp[3] = statusCheckCondition
		f.sendStatus(resp, ua)
	}
	err := <-done
	var serr *SCSIError
	require.ErrorAs(t, err, &serr)
	require.EqualError(t, err, "iscsi: WRITE(16) of 1 blocks at LBA 0: CHECK CONDITION, UNIT ATTENTION: power on, reset, or bus device reset occurred (ASC 0x29 ASCQ 0x00)")
}

// close logs out; commands after it, and one still in flight, fail with ErrClosed.
func TestSessionClose(t *testing.T) {
	s, f := startSession(t, testParams, quietTiming)
	inFlight := goCommand(s, cdbBlocks(scsiRead16, 0, 0, 1), make([]byte, 512), nil)
	f.recvOp(opSCSICmd)
	closed := make(chan struct{})
	go func() { s.close(); close(closed) }()
	req, _ := f.recvOp(opLogoutReq)
	require.NotZero(t, req[0]&bitImmediate)
	require.Equal(t, byte(flagFinal), req.flags(), "reason: close the session")
	f.sendStatus(reply(opLogoutResp, flagFinal, req), nil)
	<-closed
	require.ErrorIs(t, wait(t, inFlight).err, backend.ErrClosed)
	_, err := s.command(make([]byte, 6), nil, nil)
	require.ErrorIs(t, err, backend.ErrClosed)
	require.False(t, backend.IsRetryable(err))
}

// Commands from many goroutines against a target that answers each as it comes, for the race
// detector: ITTs are never reused while in flight, CmdSNs are dense, nothing leaks.
func TestSessionConcurrentCommands(t *testing.T) {
	s, f := startSession(t, testParams, quietTiming)
	go func() {
		for {
			if err := f.conn.SetReadDeadline(time.Time{}); err != nil {
				return
			}
			h, err := f.rd.next()
			if err != nil {
				return
			}
			req := *h
			if _, err := f.rd.readData(); err != nil {
				return
			}
			if req.opcode() != opSCSICmd {
				continue
			}
			n := int(req.u32(20))
			if req.flags()&flagRead == 0 {
				resp := reply(opSCSIResp, flagFinal, req)
				resp.setU32(24, f.statSN)
				f.statSN++
				if f.wr.write(&resp, nil) != nil {
					return
				}
				continue
			}
			h2 := dataIn(req, 0, 0, statusGood)
			h2.setU32(24, f.statSN)
			h2.setU32(32, f.maxCmdSN+f.statSN)
			f.statSN++
			if f.wr.write(&h2, bytes.Repeat([]byte{byte(binary.BigEndian.Uint64(req[34:]))}, n)) != nil {
				return
			}
		}
	}()
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 50 {
				lba := uint64(g*50 + i)
				buf := make([]byte, 512)
				_, err := s.exec(cdbBlocks(scsiRead16, 0, lba, 1), buf, nil)
				if !assert.NoError(t, err) || !assert.Equal(t, bytes.Repeat([]byte{byte(lba)}, 512), buf, "goroutine %d read %d", g, i) {
					return
				}
			}
		})
	}
	wg.Wait()
}

// Commands started while plugged are held: nothing reaches the target until the last holder
// unplugs, or until another PDU is sent, which they then precede in CmdSN order; every one is
// answered as if sent at once.
func TestSessionPlugged(t *testing.T) {
	s, f := startSession(t, testParams, quietTiming)
	var plugs atomic.Int32
	ended := make(chan uint32, 8)
	start := func(lba uint64, buf []byte) {
		t.Helper()
		done := make(chan bool)
		go func() { // on a pipe, a send the target does not read would block
			done <- s.start(cdbBlocks(scsiRead16, 0, lba, 1), buf, nil, &plugs, func(tk *task) {
				require.True(t, tk.good())
				ended <- uint32(lba)
			})
		}()
		select {
		case ok := <-done:
			require.True(t, ok)
		case <-time.After(5 * time.Second):
			t.Fatal("a plugged start sent its command")
		}
	}

	plugs.Add(2) // two holders
	bufs := make([][]byte, 5)
	for i := range 3 {
		bufs[i] = make([]byte, 512)
		start(uint64(i), bufs[i])
	}
	plugs.Add(-1)
	go s.unplug(&plugs) // the other holder still holds
	f.quiet(50 * time.Millisecond)
	plugs.Add(-1)
	go s.unplug(&plugs) // on a pipe, the send waits for the target to read
	for i := range 3 {
		req, _ := f.recvOp(opSCSICmd)
		require.Equal(t, uint32(i+1), req.u32(24), "CmdSN in the order started")
		f.sendStatus(dataIn(req, 0, 0, statusGood), make([]byte, 512))
		require.Equal(t, uint32(i), <-ended)
	}

	// Held commands go ahead of a command sent unplugged.
	plugs.Add(1)
	for i := 3; i < 5; i++ {
		bufs[i] = make([]byte, 512)
		start(uint64(i), bufs[i])
	}
	res := goCommand(s, cdbBlocks(scsiRead16, 0, 9, 1), make([]byte, 512), nil)
	for i := range 3 {
		req, _ := f.recvOp(opSCSICmd)
		require.Equal(t, uint32(4+i), req.u32(24), "CmdSN in the order started")
		f.sendStatus(dataIn(req, 0, 0, statusGood), make([]byte, 512))
	}
	require.NoError(t, wait(t, res).err)
	require.ElementsMatch(t, []uint32{3, 4}, []uint32{<-ended, <-ended})
	plugs.Add(-1)
	go s.unplug(&plugs)
	f.quiet(50 * time.Millisecond)
}

// A writer holding more than maxHeld sends it; flush sends the rest, and a write sends what is
// held ahead of its own PDU.
func TestPDUWriterHold(t *testing.T) {
	var out bytes.Buffer
	w := &pduWriter{w: &out, headerDigest: true, dataDigest: true}
	var want bytes.Buffer
	ref := &pduWriter{w: &want, headerDigest: true, dataDigest: true}
	for i := range 3 {
		var h bhs
		h.setOpcode(opSCSICmd, false)
		h.setITT(uint32(i))
		data := bytes.Repeat([]byte{byte(i)}, 100+i)
		require.NoError(t, w.hold(&h, data))
		require.NoError(t, ref.write(&h, data))
	}
	require.Zero(t, out.Len(), "held, not sent")
	var h bhs
	h.setOpcode(opNOPOut, true)
	require.NoError(t, w.write(&h, nil))
	require.NoError(t, ref.write(&h, nil))
	require.Equal(t, want.Bytes(), out.Bytes(), "what was held, then the PDU written")

	out.Reset()
	held := 0
	for out.Len() == 0 {
		require.NoError(t, w.hold(&h, make([]byte, 8192)))
		held++
		require.Less(t, len(w.held), maxHeld)
	}
	const pdu = bhsLen + digestLen + 8192 + digestLen
	require.Equal(t, held*pdu, out.Len(), "sent whole once past maxHeld")
	require.NoError(t, w.hold(&h, nil))
	require.NoError(t, w.flush())
	require.Empty(t, w.held)
	require.Equal(t, held*pdu+bhsLen+digestLen, out.Len())
}
