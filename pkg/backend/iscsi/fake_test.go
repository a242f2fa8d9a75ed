package iscsi

import (
	"errors"
	"log/slog"
	"net"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// fakeTarget is the target's end of a connection, driven step by step by a test on its own
// goroutine: it reads what the initiator sends and writes what the test says, well-formed or not.
// It exists for fault injection; the backend's behaviour against a real target is tested against
// tgtd (integration/iscsibackend_test.go).
type fakeTarget struct {
	t                          *testing.T
	conn                       net.Conn
	rd                         *pduReader
	wr                         *pduWriter
	statSN, expCmdSN, maxCmdSN uint32
	// hostile: the initiator is expected to hang up in the middle of what we send.
	hostile bool
}

func newFakeTarget(t *testing.T, conn net.Conn) *fakeTarget {
	return &fakeTarget{t: t, conn: conn, rd: newPDUReader(conn, 1<<20), wr: &pduWriter{w: conn},
		statSN: 100, expCmdSN: 1, maxCmdSN: 32}
}

// recv reads the initiator's next PDU, failing the test if none comes within a few seconds.
func (f *fakeTarget) recv() (bhs, []byte) {
	f.t.Helper()
	require.NoError(f.t, f.conn.SetReadDeadline(time.Now().Add(5*time.Second)))
	h, err := f.rd.next()
	require.NoError(f.t, err)
	d, err := f.rd.readData()
	require.NoError(f.t, err)
	return *h, append([]byte(nil), d...)
}

// recvOp is recv that requires the opcode.
func (f *fakeTarget) recvOp(op byte) (bhs, []byte) {
	f.t.Helper()
	h, d := f.recv()
	require.Equal(f.t, opName(op), opName(h.opcode()), "initiator's PDU")
	return h, d
}

// quiet requires that the initiator sends nothing for d.
func (f *fakeTarget) quiet(d time.Duration) {
	f.t.Helper()
	require.NoError(f.t, f.conn.SetReadDeadline(time.Now().Add(d)))
	h, err := f.rd.next()
	var ne net.Error
	require.True(f.t, errors.As(err, &ne) && ne.Timeout(), "expected silence, got %v %v", h, err)
}

// send writes a PDU with the target's window in it.
func (f *fakeTarget) send(h bhs, data []byte) {
	f.t.Helper()
	h.setU32(28, f.expCmdSN)
	h.setU32(32, f.maxCmdSN)
	f.check(f.wr.write(&h, data))
}

func (f *fakeTarget) check(err error) {
	f.t.Helper()
	if !f.hostile {
		require.NoError(f.t, err)
	}
}

// sendStatus is send for a PDU that carries a status: it takes the next StatSN.
func (f *fakeTarget) sendStatus(h bhs, data []byte) {
	f.t.Helper()
	h.setU32(24, f.statSN)
	f.statSN++
	f.send(h, data)
}

// raw writes bytes as they are.
func (f *fakeTarget) raw(b []byte) {
	f.t.Helper()
	_, err := f.conn.Write(b)
	f.check(err)
}

// reply is a PDU of the target answering the initiator's PDU req.
func reply(op byte, flags byte, req bhs) bhs {
	var h bhs
	h.setOpcode(op, false)
	h[1] = flags
	copy(h[8:16], req[8:16])
	h.setITT(req.itt())
	h.setTTT(reservedTag)
	return h
}

// testLog is where the package's warnings go in tests.
var testLog = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
