package kernel

// Generic netlink by hand, just what attaching the kernel's NBD client needs: the controller's
// CTRL_CMD_GETFAMILY to find the "nbd" family's id, and that family's CONNECT, DISCONNECT and
// RECONFIGURE (include/uapi/linux/nbd-netlink.h and drivers/block/nbd.c of Linux). Headers and attribute
// payloads are in the host's byte order.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"

	"golang.org/x/sys/unix"
)

// The nbd family, from include/uapi/linux/nbd-netlink.h.
const (
	nbdGenlFamily  = "nbd"
	nbdGenlVersion = 1

	nbdCmdConnect    = 1
	nbdCmdDisconnect = 2
	// nbdCmdReconfigure gives a bound device new sockets in place of its dead connections
	// (nbd_genl_reconfigure, nbd_reconnect_socket); it needs the backend identifier the device
	// was connected with, if it was given one.
	nbdCmdReconfigure = 3

	nbdAttrIndex           = 1 // u32
	nbdAttrSizeBytes       = 2 // u64
	nbdAttrBlockSizeBytes  = 3 // u64
	nbdAttrTimeout         = 4 // u64, seconds
	nbdAttrServerFlags     = 5 // u64, the transmission flags
	nbdAttrSockets         = 7 // nested NBD_SOCK_ITEMs
	nbdAttrDeadConnTimeout = 8 // u64, seconds
	// nbdAttrBackendIdentifier is a string the kernel keeps with the device
	// (/sys/block/nbdN/backend) and compares on reconfigure.
	nbdAttrBackendIdentifier = 10

	nbdSockItem = 1 // nested, holding nbdSockFD
	nbdSockFD   = 1 // u32
)

// ctrlVersion is the version of the generic netlink controller's commands.
const ctrlVersion = 2

const (
	nlAttrHeaderSize   = 4
	genlHeaderSize     = 4
	nlAlign            = 4
	nlRecvBufSize      = 32 << 10
	nlErrorPayloadSize = 4 + unix.SizeofNlMsghdr // the error, then the request's header (NETLINK_CAP_ACK)
)

// nlAttrs builds a sequence of netlink attributes.
type nlAttrs []byte

func (a nlAttrs) add(typ uint16, payload []byte) nlAttrs {
	var h [nlAttrHeaderSize]byte
	binary.NativeEndian.PutUint16(h[0:], uint16(nlAttrHeaderSize+len(payload)))
	binary.NativeEndian.PutUint16(h[2:], typ)
	a = append(append(a, h[:]...), payload...)
	return append(a, make([]byte, nlPad(len(payload)))...)
}

func (a nlAttrs) u32(typ uint16, v uint32) nlAttrs {
	return a.add(typ, binary.NativeEndian.AppendUint32(nil, v))
}

func (a nlAttrs) u64(typ uint16, v uint64) nlAttrs {
	return a.add(typ, binary.NativeEndian.AppendUint64(nil, v))
}

// str adds a NUL-terminated string (NLA_NUL_STRING and NLA_STRING accept it).
func (a nlAttrs) str(typ uint16, s string) nlAttrs { return a.add(typ, append([]byte(s), 0)) }

func (a nlAttrs) nested(typ uint16, inner nlAttrs) nlAttrs {
	return a.add(typ|unix.NLA_F_NESTED, inner)
}

func nlPad(n int) int { return (nlAlign - n%nlAlign) % nlAlign }

// genlRequest is a whole generic netlink request that asks for an acknowledgement.
func genlRequest(family uint16, cmd, version uint8, seq uint32, attrs nlAttrs) []byte {
	b := make([]byte, unix.SizeofNlMsghdr+genlHeaderSize, unix.SizeofNlMsghdr+genlHeaderSize+len(attrs))
	binary.NativeEndian.PutUint32(b[0:], uint32(cap(b)))
	binary.NativeEndian.PutUint16(b[4:], family)
	binary.NativeEndian.PutUint16(b[6:], unix.NLM_F_REQUEST|unix.NLM_F_ACK)
	binary.NativeEndian.PutUint32(b[8:], seq)
	// The port id (b[12:16]) stays 0: the kernel fills in the socket's own.
	b[16], b[17] = cmd, version
	return append(b, attrs...)
}

// nlMessage is one received netlink message; payload follows the netlink header.
type nlMessage struct {
	typ, flags uint16
	seq        uint32
	payload    []byte
}

// parseNetlink splits a datagram into its messages.
func parseNetlink(b []byte) ([]nlMessage, error) {
	var msgs []nlMessage
	for len(b) > 0 {
		if len(b) < unix.SizeofNlMsghdr {
			return nil, fmt.Errorf("netlink: %d bytes left, shorter than a message header", len(b))
		}
		n := int(binary.NativeEndian.Uint32(b))
		if n < unix.SizeofNlMsghdr || n > len(b) {
			return nil, fmt.Errorf("netlink: message length %d with %d bytes left", n, len(b))
		}
		msgs = append(msgs, nlMessage{
			typ:     binary.NativeEndian.Uint16(b[4:]),
			flags:   binary.NativeEndian.Uint16(b[6:]),
			seq:     binary.NativeEndian.Uint32(b[8:]),
			payload: b[unix.SizeofNlMsghdr:n],
		})
		b = b[min(n+nlPad(n), len(b)):]
	}
	return msgs, nil
}

// parseAttrs indexes a sequence of attributes by type (the nested flag cleared); the last of
// repeated types wins.
func parseAttrs(b []byte) (map[uint16][]byte, error) {
	attrs := map[uint16][]byte{}
	for len(b) > 0 {
		if len(b) < nlAttrHeaderSize {
			return nil, fmt.Errorf("netlink: %d bytes left, shorter than an attribute header", len(b))
		}
		n := int(binary.NativeEndian.Uint16(b))
		if n < nlAttrHeaderSize || n > len(b) {
			return nil, fmt.Errorf("netlink: attribute length %d with %d bytes left", n, len(b))
		}
		attrs[binary.NativeEndian.Uint16(b[2:])&^(unix.NLA_F_NESTED|unix.NLA_F_NET_BYTEORDER)] = b[nlAttrHeaderSize:n]
		b = b[min(n+nlPad(n), len(b)):]
	}
	return attrs, nil
}

// genlError is the kernel's refusal of a request: an errno and, when the kernel gave one, its
// extended ack message.
type genlError struct {
	errno syscall.Errno
	msg   string
}

func (e *genlError) Error() string {
	if e.msg != "" {
		return fmt.Sprintf("%v (%s)", e.errno, e.msg)
	}
	return e.errno.Error()
}

func (e *genlError) Unwrap() error { return e.errno }

// parseAck reads an NLMSG_ERROR message: nil for an acknowledgement, a *genlError otherwise.
func parseAck(m nlMessage) error {
	if len(m.payload) < nlErrorPayloadSize {
		return fmt.Errorf("netlink: error message of %d bytes", len(m.payload))
	}
	code := int32(binary.NativeEndian.Uint32(m.payload))
	if code == 0 {
		return nil
	}
	e := &genlError{errno: syscall.Errno(-code)}
	if m.flags&unix.NLM_F_ACK_TLVS != 0 {
		if attrs, err := parseAttrs(m.payload[nlErrorPayloadSize:]); err == nil {
			if s := attrs[unix.NLMSGERR_ATTR_MSG]; len(s) > 0 {
				e.msg = string(s[:len(s)-1]) // NUL-terminated
			}
		}
	}
	return e
}

// genlConn is a generic netlink socket that sends one request at a time.
type genlConn struct {
	fd  int
	seq uint32
}

func dialGenl() (*genlConn, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_GENERIC)
	if err != nil {
		return nil, fmt.Errorf("generic netlink socket: %w", err)
	}
	// Acknowledgements without a copy of the request, and with the kernel's message if any.
	for _, opt := range []int{unix.NETLINK_CAP_ACK, unix.NETLINK_EXT_ACK} {
		if err := unix.SetsockoptInt(fd, unix.SOL_NETLINK, opt, 1); err != nil {
			unix.Close(fd)
			return nil, fmt.Errorf("generic netlink socket option %d: %w", opt, err)
		}
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("generic netlink bind: %w", err)
	}
	return &genlConn{fd: fd}, nil
}

func (g *genlConn) Close() error { return unix.Close(g.fd) }

// request sends one request and returns the replies that came before its acknowledgement, or
// the kernel's error.
func (g *genlConn) request(family uint16, cmd, version uint8, attrs nlAttrs) ([]nlMessage, error) {
	g.seq++
	if err := unix.Sendto(g.fd, genlRequest(family, cmd, version, g.seq, attrs), 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, fmt.Errorf("netlink send: %w", err)
	}
	var replies []nlMessage
	buf := make([]byte, nlRecvBufSize)
	for {
		n, _, err := unix.Recvfrom(g.fd, buf, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("netlink receive: %w", err)
		}
		msgs, err := parseNetlink(buf[:n])
		if err != nil {
			return nil, err
		}
		for _, m := range msgs {
			switch {
			case m.seq != g.seq:
				// Not an answer to this request.
			case m.typ == unix.NLMSG_ERROR:
				return replies, parseAck(m)
			default:
				m.payload = append([]byte(nil), m.payload...) // buf is reused
				replies = append(replies, m)
			}
		}
	}
}

// errFamilyNotFound is the controller's answer for a family no loaded module registered.
var errFamilyNotFound = errors.New("generic netlink family not registered")

// family resolves a generic netlink family's id.
func (g *genlConn) family(name string) (uint16, error) {
	replies, err := g.request(unix.GENL_ID_CTRL, unix.CTRL_CMD_GETFAMILY, ctrlVersion,
		nlAttrs(nil).str(unix.CTRL_ATTR_FAMILY_NAME, name))
	if errors.Is(err, unix.ENOENT) {
		return 0, fmt.Errorf("%w: %q", errFamilyNotFound, name)
	}
	if err != nil {
		return 0, fmt.Errorf("resolving generic netlink family %q: %w", name, err)
	}
	for _, m := range replies {
		if m.typ != unix.GENL_ID_CTRL || len(m.payload) < genlHeaderSize {
			continue
		}
		attrs, err := parseAttrs(m.payload[genlHeaderSize:])
		if err != nil {
			return 0, err
		}
		if id := attrs[unix.CTRL_ATTR_FAMILY_ID]; len(id) == 2 {
			return binary.NativeEndian.Uint16(id), nil
		}
	}
	return 0, fmt.Errorf("generic netlink family %q: no id in the controller's reply", name)
}

// kernelConfig is what NBD_CMD_CONNECT tells the kernel about a device.
type kernelConfig struct {
	index           uint32
	size, blockSize uint64
	flags           uint16 // transmission flags, as negotiated
	timeout         uint64 // seconds before a request is deemed lost
	deadConnTimeout uint64 // seconds a request waits for a dead connection to be replaced
	backend         string // the backend identifier ("": none)
	fds             []int
}

func connectAttrs(c kernelConfig) nlAttrs {
	a := nlAttrs(nil).
		u32(nbdAttrIndex, c.index).
		u64(nbdAttrSizeBytes, c.size).
		u64(nbdAttrBlockSizeBytes, c.blockSize).
		u64(nbdAttrServerFlags, uint64(c.flags)).
		u64(nbdAttrTimeout, c.timeout).
		u64(nbdAttrDeadConnTimeout, c.deadConnTimeout)
	if c.backend != "" {
		a = a.str(nbdAttrBackendIdentifier, c.backend)
	}
	return a.nested(nbdAttrSockets, sockAttrs(c.fds))
}

// reconfigureAttrs gives a bound device the sockets c.fds in place of dead connections, and
// sets its timeouts. The size, block size and flags stay as the device has them: the kernel
// cannot change the flags, and changing the size of a mounted device is not a restart's business.
func reconfigureAttrs(c kernelConfig) nlAttrs {
	a := nlAttrs(nil).
		u32(nbdAttrIndex, c.index).
		u64(nbdAttrTimeout, c.timeout).
		u64(nbdAttrDeadConnTimeout, c.deadConnTimeout)
	if c.backend != "" {
		a = a.str(nbdAttrBackendIdentifier, c.backend)
	}
	return a.nested(nbdAttrSockets, sockAttrs(c.fds))
}

func sockAttrs(fds []int) nlAttrs {
	var socks nlAttrs
	for _, fd := range fds {
		socks = socks.nested(nbdSockItem, nlAttrs(nil).u32(nbdSockFD, uint32(fd)))
	}
	return socks
}

func disconnectAttrs(index uint32) nlAttrs { return nlAttrs(nil).u32(nbdAttrIndex, index) }
