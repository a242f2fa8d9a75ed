package nbdtest

import (
	"encoding/binary"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/nbd/proto"
)

// RawClient speaks the protocol byte by byte, so that tests can also speak it wrongly. Its methods
// fail the test when the server does not answer as the protocol says.
type RawClient struct {
	T          testing.TB
	NC         net.Conn
	Structured bool              // structured replies were negotiated
	reads      map[uint64]uint32 // cookie -> length of READs whose simple reply is pending
}

// DialRaw connects to a server.
func DialRaw(t testing.TB, network, addr string) *RawClient {
	t.Helper()
	nc, err := net.Dial(network, addr)
	require.NoError(t, err)
	return NewRawClient(t, nc)
}

// NewRawClient speaks on nc, which it closes when the test ends.
func NewRawClient(t testing.TB, nc net.Conn) *RawClient {
	t.Helper()
	c := &RawClient{T: t, NC: nc, reads: map[uint64]uint32{}}
	c.bound()
	t.Cleanup(func() { nc.Close() })
	return c
}

// exchangeBound bounds each Send and Recv: a server that fails to answer fails the test, not
// hangs it. It is far above what an exchange takes on a loaded machine (64 MiB requests under the
// race detector on two shared cores took 20 s and more).
const exchangeBound = 2 * time.Minute

// bound sets the connection's deadline exchangeBound from now.
func (c *RawClient) bound() {
	c.T.Helper()
	require.NoError(c.T, c.NC.SetDeadline(time.Now().Add(exchangeBound)))
}

// Send writes parts in turn.
func (c *RawClient) Send(parts ...[]byte) {
	c.T.Helper()
	c.bound()
	for _, p := range parts {
		if len(p) == 0 {
			continue // a write of nothing fails once the server closed, which DISC makes it do
		}
		_, err := c.NC.Write(p)
		require.NoError(c.T, err)
	}
}

// Recv reads n bytes.
func (c *RawClient) Recv(n int) []byte {
	c.T.Helper()
	c.bound()
	b := make([]byte, n)
	_, err := io.ReadFull(c.NC, b)
	require.NoError(c.T, err)
	return b
}

// Greet reads the server's greeting and sends the client flags.
func (c *RawClient) Greet() {
	c.T.Helper()
	g := c.Recv(18)
	require.Equal(c.T, proto.MagicNBD, binary.BigEndian.Uint64(g[0:]))
	require.Equal(c.T, proto.MagicIHaveOpt, binary.BigEndian.Uint64(g[8:]))
	require.Equal(c.T, proto.HandshakeFlagFixedNewstyle|proto.HandshakeFlagNoZeroes, binary.BigEndian.Uint16(g[16:]))
	c.Send(binary.BigEndian.AppendUint32(nil, proto.ClientFlagFixedNewstyle|proto.ClientFlagNoZeroes))
}

// Option sends an option.
func (c *RawClient) Option(opt uint32, data []byte) {
	c.T.Helper()
	var h [proto.OptionHeaderSize]byte
	proto.PutOptionHeader(h[:], opt, uint32(len(data)))
	c.Send(h[:], data)
}

// OptReply reads one reply to option opt.
func (c *RawClient) OptReply(opt uint32) (typ uint32, data []byte) {
	c.T.Helper()
	gotOpt, typ, n, ok := proto.ParseOptionReplyHeader(c.Recv(proto.OptionReplyHeaderSize))
	require.True(c.T, ok, "option reply magic")
	require.Equal(c.T, opt, gotOpt)
	return typ, c.Recv(int(n))
}

// Infos collects the NBD_REP_INFO replies to INFO or GO, by type, and the final reply type.
func (c *RawClient) Infos(opt uint32) (map[uint16][]byte, uint32) {
	c.T.Helper()
	got := map[uint16][]byte{}
	for {
		typ, data := c.OptReply(opt)
		if typ != proto.RepInfo {
			return got, typ
		}
		require.GreaterOrEqual(c.T, len(data), 2)
		got[binary.BigEndian.Uint16(data)] = data[2:]
	}
}

// Connect negotiates up to the transmission phase with NBD_OPT_GO.
func (c *RawClient) Connect(export string, structured bool) (size uint64, flags uint16) {
	c.T.Helper()
	c.Greet()
	if structured {
		c.Option(proto.OptStructuredReply, nil)
		typ, _ := c.OptReply(proto.OptStructuredReply)
		require.Equal(c.T, proto.RepAck, typ)
		c.Structured = true
	}
	return c.GoExport(export)
}

// GoExport sends NBD_OPT_GO after the greeting.
func (c *RawClient) GoExport(export string) (size uint64, flags uint16) {
	c.T.Helper()
	c.Option(proto.OptGo, proto.AppendInfoRequest(nil, export, proto.InfoBlockSize))
	infos, final := c.Infos(proto.OptGo)
	require.Equal(c.T, proto.RepAck, final)
	e := infos[proto.InfoExport]
	require.Len(c.T, e, 10)
	return binary.BigEndian.Uint64(e), binary.BigEndian.Uint16(e[8:])
}

// Request sends a request and its payload.
func (c *RawClient) Request(r proto.Request, payload []byte) {
	c.T.Helper()
	var h [proto.RequestSize]byte
	proto.PutRequest(h[:], r)
	c.SentRead(r)
	c.Send(h[:], payload)
}

// SentRead notes a request sent by hand (Send), so that Reply knows when a simple reply to it
// carries data: only when it is a READ.
func (c *RawClient) SentRead(r proto.Request) {
	if r.Type == proto.CmdRead && !c.Structured {
		c.reads[r.Cookie] = r.Length
	}
}

// Reply is one whole reply as RawClient.Reply reads it.
type Reply struct {
	Cookie uint64
	Errno  uint32
	Data   []byte
	Msg    string
	Chunks []uint16 // structured chunk types, in order
}

// Reply reads one whole reply. The server sends every structured reply as one chunk (or a data
// chunk and nothing else), so chunks of different replies are not interleaved.
func (c *RawClient) Reply() Reply {
	c.T.Helper()
	h := c.Recv(4)
	switch binary.BigEndian.Uint32(h) {
	case proto.MagicSimpleReply:
		errno, cookie, _ := proto.ParseSimpleReply(append(h, c.Recv(proto.SimpleReplySize-4)...))
		r := Reply{Cookie: cookie, Errno: errno}
		if n, isRead := c.reads[cookie]; isRead {
			delete(c.reads, cookie)
			if errno == 0 {
				r.Data = c.Recv(int(n))
			}
		}
		return r
	case proto.MagicStructReply:
		require.True(c.T, c.Structured, "structured reply without negotiation")
		var r Reply
		for {
			ch, _ := proto.ParseChunkHeader(append(h, c.Recv(proto.StructReplySize-4)...))
			r.Cookie = ch.Cookie
			r.Chunks = append(r.Chunks, ch.Type)
			p := c.Recv(int(ch.Length))
			switch ch.Type {
			case proto.ReplyTypeOffsetData:
				r.Data = append(r.Data, p[8:]...)
			case proto.ReplyTypeError:
				r.Errno = binary.BigEndian.Uint32(p)
				r.Msg = string(p[6 : 6+binary.BigEndian.Uint16(p[4:])])
			}
			if ch.Flags&proto.ReplyFlagDone != 0 {
				return r
			}
			h = c.Recv(4)
		}
	default:
		c.T.Fatalf("bad reply magic %x", h)
		return Reply{}
	}
}

// ExpectClosed checks that the server closes the connection (after any bytes it still sends).
func (c *RawClient) ExpectClosed() {
	c.T.Helper()
	_, err := io.Copy(io.Discard, c.NC)
	if err != nil {
		require.ErrorIs(c.T, err, syscall.ECONNRESET, "want the server to close the connection")
	}
}
