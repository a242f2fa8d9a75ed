package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/nbd/proto"
	"github.com/tierblk/tierblk/pkg/backend"
)

func TestClientRemoteErrorMapping(t *testing.T) {
	const size = 1 << 20
	for _, tc := range []struct {
		errno       uint32
		off, length int64
		want        error
		errnoWant   syscall.Errno
	}{
		{errno: proto.ErrnoPerm, want: backend.ErrReadOnly, errnoWant: syscall.EPERM},
		{errno: proto.ErrnoNotSup, want: backend.ErrNotSupported, errnoWant: syscall.ENOTSUP},
		{errno: proto.ErrnoNoSpc, off: size - 512, length: 4096, want: backend.ErrOutOfRange, errnoWant: syscall.ENOSPC},
		{errno: proto.ErrnoInval, off: size, length: 1, want: backend.ErrOutOfRange, errnoWant: syscall.EINVAL},
		{errno: proto.ErrnoNoSpc, length: 4096, errnoWant: syscall.ENOSPC},
		{errno: proto.ErrnoInval, length: 4096, errnoWant: syscall.EINVAL},
		{errno: proto.ErrnoIO, length: 4096, errnoWant: syscall.EIO},
		{errno: proto.ErrnoOverflow, length: 4096, errnoWant: syscall.EOVERFLOW},
		{errno: 9999, length: 4096, errnoWant: syscall.EINVAL},
	} {
		t.Run(fmt.Sprint(tc.errno, tc.off), func(t *testing.T) {
			err := remoteError(proto.CmdWrite, tc.off, tc.length, size, tc.errno, "why")
			require.ErrorIs(t, err, tc.errnoWant)
			require.Contains(t, err.Error(), "why")
			if tc.want != nil {
				require.ErrorIs(t, err, tc.want)
				require.False(t, backend.IsRetryable(err))
			} else {
				require.True(t, backend.IsRetryable(err))
			}
		})
	}
}

// clientOptReply encodes an option reply as a server sends it.
func clientOptReply(opt, typ uint32, data []byte) []byte {
	b := make([]byte, proto.OptionReplyHeaderSize, proto.OptionReplyHeaderSize+len(data))
	proto.PutOptionReplyHeader(b, opt, typ, uint32(len(data)))
	return append(b, data...)
}

// FuzzClientHandshake feeds arbitrary server bytes to the handshake: it must return, without
// panicking, and only with sane export details.
func FuzzClientHandshake(f *testing.F) {
	greeting := binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(nil, proto.MagicNBD), proto.MagicIHaveOpt)
	greeting = binary.BigEndian.AppendUint16(greeting, proto.HandshakeFlagFixedNewstyle|proto.HandshakeFlagNoZeroes)
	export := binary.BigEndian.AppendUint16(nil, proto.InfoExport)
	export = binary.BigEndian.AppendUint64(export, 1<<20)
	export = binary.BigEndian.AppendUint16(export, proto.FlagHasFlags|proto.FlagSendFlush)
	sizes := binary.BigEndian.AppendUint16(nil, proto.InfoBlockSize)
	for _, v := range []uint32{512, 4096, 1 << 20} {
		sizes = binary.BigEndian.AppendUint32(sizes, v)
	}
	f.Add(slices.Concat(greeting, clientOptReply(proto.OptStructuredReply, proto.RepAck, nil),
		clientOptReply(proto.OptGo, proto.RepInfo, export), clientOptReply(proto.OptGo, proto.RepInfo, sizes), clientOptReply(proto.OptGo, proto.RepAck, nil)))
	f.Add(slices.Concat(greeting, clientOptReply(proto.OptStructuredReply, proto.RepErrUnsup, nil),
		clientOptReply(proto.OptGo, proto.RepErrUnsup, nil), export[2:]))
	f.Add(slices.Concat(greeting, clientOptReply(proto.OptStructuredReply, proto.RepAck, nil),
		clientOptReply(proto.OptGo, proto.RepErrUnknown, []byte("no such export"))))
	f.Fuzz(func(t *testing.T, in []byte) {
		a, b := net.Pipe()
		go func() { _, _ = io.Copy(io.Discard, b) }()
		go func() { _, _ = b.Write(in); b.Close() }()
		s, err := handshake(a, "disk", true, nil)
		a.Close()
		if err != nil {
			return
		}
		e := s.export
		require.GreaterOrEqual(t, e.Size, int64(0))
		require.NotZero(t, e.MinBlock)
		require.Zero(t, e.MinBlock&(e.MinBlock-1), "minimum block size must be a power of two")
		require.GreaterOrEqual(t, e.MaxBlock, e.MinBlock)
	})
}

// FuzzClientReplies feeds arbitrary transmission-phase bytes to the reply reader with three
// requests pending: it must end (the input runs out) without panicking or writing outside the
// buffers, and finish each request at most once.
func FuzzClientReplies(f *testing.F) {
	simple := func(errno uint32, cookie uint64, data []byte) []byte {
		b := make([]byte, proto.SimpleReplySize)
		proto.PutSimpleReply(b, errno, cookie)
		return append(b, data...)
	}
	chunk := func(flags, typ uint16, cookie uint64, payload []byte) []byte {
		b := make([]byte, proto.StructReplySize)
		proto.PutChunkHeader(b, proto.ChunkHeader{Flags: flags, Type: typ, Cookie: cookie, Length: uint32(len(payload))})
		return append(b, payload...)
	}
	offData := binary.BigEndian.AppendUint64(nil, 0)
	offData = append(offData, make([]byte, 4096)...)
	hole := binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint64(nil, 8192), 100)
	errChunk := append(binary.BigEndian.AppendUint16(binary.BigEndian.AppendUint32(nil, proto.ErrnoIO), 3), "bad"...)
	f.Add(false, slices.Concat(simple(0, 1, make([]byte, 4096)), simple(0, 2, nil), simple(proto.ErrnoShutdown, 3, nil)))
	f.Add(true, slices.Concat(chunk(0, proto.ReplyTypeOffsetData, 1, offData), chunk(proto.ReplyFlagDone, proto.ReplyTypeNone, 1, nil),
		chunk(proto.ReplyFlagDone, proto.ReplyTypeError, 2, errChunk), chunk(proto.ReplyFlagDone, proto.ReplyTypeOffsetHole, 3, hole)))
	f.Fuzz(func(t *testing.T, structured bool, in []byte) {
		c := &Client{log: slog.New(slog.DiscardHandler), export: Export{Size: 1 << 20, MinBlock: 1, MaxBlock: 1 << 20}}
		c.ctx, c.cancel = context.WithCancel(context.Background())
		defer c.cancel()
		cn := newConn(c, 0)
		a, b := net.Pipe()
		go func() { _, _ = io.Copy(io.Discard, b) }()
		s := &session{nc: a, br: bufio.NewReader(bytes.NewReader(in)), structured: structured}
		var wg sync.WaitGroup
		reqs := []*request{
			{Request: proto.Request{Type: proto.CmdRead, Cookie: 1, Offset: 0, Length: 4096}, buf: make([]byte, 4096)},
			{Request: proto.Request{Type: proto.CmdWrite, Cookie: 2, Offset: 4096, Length: 10}, buf: make([]byte, 10)},
			{Request: proto.Request{Type: proto.CmdRead, Cookie: 3, Offset: 8192, Length: 100}, buf: make([]byte, 100)},
		}
		for _, r := range reqs {
			wg.Add(1)
			r.wg = &wg
			cn.pending[r.Cookie] = r
		}
		cn.s = s
		require.Error(t, cn.readReplies(s), "the input always runs out")
		a.Close()
		b.Close()
		c.wg.Wait()
		// Every request that left the pending set was finished once (twice would panic): finishing
		// the rest completes the group.
		for _, r := range cn.pending {
			r.finish(nil)
		}
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("a request left the pending set without being finished")
		}
	})
}
