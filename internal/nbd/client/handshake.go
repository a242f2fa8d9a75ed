package client

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"net"
	"time"

	"github.com/tierblk/tierblk/internal/nbd/proto"
)

// session is one negotiated connection, ready for the transmission phase.
type session struct {
	nc         net.Conn
	br         *bufio.Reader
	export     Export
	structured bool
	overTLS    bool // the negotiation goes on over TLS
}

// connect dials the server and negotiates the export. Close or ctx abort it.
func (c *Client) connect(ctx context.Context) (*session, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.DialTimeout)
	defer cancel()
	stopOnClose := context.AfterFunc(c.ctx, cancel)
	defer stopOnClose()

	var d net.Dialer
	nc, err := d.DialContext(ctx, c.cfg.Network, c.cfg.Address)
	if err != nil {
		return nil, fmt.Errorf("nbd: connect to %s %s: %w", c.cfg.Network, c.cfg.Address, err)
	}
	// The handshake does blocking reads; a deadline in the past makes them return at once.
	interrupt := context.AfterFunc(ctx, func() { nc.SetDeadline(time.Unix(1, 0)) })
	s, err := handshake(nc, c.cfg.Export, true, c.cfg.TLS)
	if !interrupt() {
		err = errors.Join(ctx.Err(), err)
	}
	if err == nil {
		err = nc.SetDeadline(time.Time{})
	}
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("nbd: handshake with %s %s: %w", c.cfg.Network, c.cfg.Address, err)
	}
	return s, nil
}

// Handshake negotiates export on nc for a peer that takes the connection over for the
// transmission phase and knows only simple replies (the kernel's NBD client): it asks for no
// structured replies, and fails if the server sent anything past the handshake, which the peer
// would never see. It returns what the server said of the export.
func Handshake(nc net.Conn, export string) (Export, error) {
	s, err := handshake(nc, export, false, nil)
	if err != nil {
		return Export{}, err
	}
	if n := s.br.Buffered(); n > 0 {
		// The server sends nothing after NBD_OPT_GO until asked: these bytes would be lost.
		return Export{}, fmt.Errorf("%w: %d bytes after the handshake", ErrProtocol, n)
	}
	return s.export, nil
}

// handshake runs the fixed newstyle negotiation: TLS first if tlsCfg is set, structured replies
// if structured asks for them and the server has them, then NBD_OPT_GO asking for block sizes, or
// NBD_OPT_EXPORT_NAME for servers too old for GO. The kernel's client, which takes over some
// sessions, knows only simple replies.
func handshake(nc net.Conn, export string, structured bool, tlsCfg *tls.Config) (*session, error) {
	if len(export) > proto.MaxExportNameLen {
		return nil, fmt.Errorf("export name is %d bytes; the protocol allows %d", len(export), proto.MaxExportNameLen)
	}
	s := &session{nc: nc, br: bufio.NewReaderSize(nc, 64<<10)}
	var greeting [18]byte
	if _, err := io.ReadFull(s.br, greeting[:]); err != nil {
		return nil, fmt.Errorf("%w: no NBD greeting: %w", ErrNotNBDServer, err)
	}
	if binary.BigEndian.Uint64(greeting[0:]) != proto.MagicNBD {
		return nil, fmt.Errorf("%w: it greeted with %q", ErrNotNBDServer, greeting[:8])
	}
	switch binary.BigEndian.Uint64(greeting[8:]) {
	case proto.MagicIHaveOpt:
	case proto.MagicOldstyle:
		return nil, fmt.Errorf("%w: the server uses the oldstyle handshake; configure it for newstyle", ErrServerRefused)
	default:
		return nil, fmt.Errorf("%w: unknown handshake magic %#x", ErrNotNBDServer, greeting[8:16])
	}
	hflags := binary.BigEndian.Uint16(greeting[16:])
	var cflags uint32
	if hflags&proto.HandshakeFlagFixedNewstyle != 0 {
		cflags |= proto.ClientFlagFixedNewstyle
	}
	noZeroes := hflags&proto.HandshakeFlagNoZeroes != 0
	if noZeroes {
		cflags |= proto.ClientFlagNoZeroes
	}
	if _, err := nc.Write(binary.BigEndian.AppendUint32(nil, cflags)); err != nil {
		return nil, err
	}
	if tlsCfg != nil {
		if hflags&proto.HandshakeFlagFixedNewstyle == 0 {
			return nil, fmt.Errorf("%w: TLS was asked for, and the server does not speak the fixed newstyle negotiation that starts it", ErrServerRefused)
		}
		if err := s.startTLS(tlsCfg); err != nil {
			return nil, err
		}
	}
	if hflags&proto.HandshakeFlagFixedNewstyle == 0 {
		// Plain newstyle knows no option but EXPORT_NAME.
		return s, s.exportName(export, noZeroes)
	}

	if structured {
		var err error
		if s.structured, err = s.optStructuredReply(); err != nil {
			return nil, err
		}
	}
	gone, err := s.optGo(export)
	if err != nil {
		return nil, err
	}
	if !gone {
		return s, s.exportName(export, noZeroes)
	}
	return s, nil
}

// startTLS upgrades the session to TLS with NBD_OPT_STARTTLS, before any other option, as the
// protocol advises a client that wants TLS whatever the server offers: the options that follow
// are then out of reach of a man in the middle. A server that refuses is not spoken to without
// TLS.
func (s *session) startTLS(cfg *tls.Config) error {
	if err := s.sendOption(proto.OptStartTLS, nil); err != nil {
		return err
	}
	typ, data, err := s.readOptionReply(proto.OptStartTLS)
	switch {
	case err != nil:
		return err
	case typ&proto.RepFlagError != 0:
		_ = s.sendOption(proto.OptAbort, nil) // the connection is closed next whatever happens
		return fmt.Errorf("%w: TLS was asked for, and the server does not offer it (NBD_OPT_STARTTLS: option error %d%s); the connection is not made without it",
			ErrServerRefused, typ&^proto.RepFlagError, serverSays(data))
	case typ != proto.RepAck:
		return fmt.Errorf("%w: reply type %d to NBD_OPT_STARTTLS", ErrProtocol, typ)
	case s.br.Buffered() > 0:
		// The TLS handshake comes next, begun by the client: bytes the server sent before it
		// would be taken as sent over TLS.
		return fmt.Errorf("%w: %d bytes after the reply to NBD_OPT_STARTTLS", ErrProtocol, s.br.Buffered())
	}
	tc := tls.Client(s.nc, cfg)
	if err := tc.Handshake(); err != nil {
		return fmt.Errorf("TLS handshake: %w", err)
	}
	s.nc, s.overTLS = tc, true
	s.br.Reset(tc)
	return nil
}

// sendOption writes one option request.
func (s *session) sendOption(opt uint32, data []byte) error {
	b := make([]byte, proto.OptionHeaderSize, proto.OptionHeaderSize+len(data))
	proto.PutOptionHeader(b, opt, uint32(len(data)))
	if _, err := s.nc.Write(append(b, data...)); err != nil {
		return s.ioErr(fmt.Sprintf("sending option %d", opt), err)
	}
	return nil
}

// readOptionReply reads one option reply to opt and returns its type and data.
func (s *session) readOptionReply(opt uint32) (uint32, []byte, error) {
	var h [proto.OptionReplyHeaderSize]byte
	if _, err := io.ReadFull(s.br, h[:]); err != nil {
		return 0, nil, s.ioErr(fmt.Sprintf("reading the reply to option %d", opt), err)
	}
	o, typ, n, ok := proto.ParseOptionReplyHeader(h[:])
	if !ok {
		return 0, nil, fmt.Errorf("%w: option reply magic %#x", ErrProtocol, h[:8])
	}
	if o != opt {
		return 0, nil, fmt.Errorf("%w: reply to option %d while option %d was asked", ErrProtocol, o, opt)
	}
	if n > proto.MaxOptionLength {
		return 0, nil, fmt.Errorf("%w: option reply of %d bytes", ErrProtocol, n)
	}
	data := make([]byte, n)
	if _, err := io.ReadFull(s.br, data); err != nil {
		return 0, nil, s.ioErr(fmt.Sprintf("reading the reply to option %d", opt), err)
	}
	return typ, data, nil
}

// ioErr is the error of a failed read or write of the negotiation, what saying which. In TLS 1.3
// the client's side of the handshake ends before the server has checked the client's certificate:
// a server that refuses it says so with an alert or by hanging up, which the next read or write
// finds.
func (s *session) ioErr(what string, err error) error {
	if s.overTLS {
		return fmt.Errorf("%s over TLS (a server that refuses this client's certificate ends the session so): %w", what, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// optStructuredReply asks for structured replies; a server without them is fine.
func (s *session) optStructuredReply() (bool, error) {
	if err := s.sendOption(proto.OptStructuredReply, nil); err != nil {
		return false, err
	}
	typ, data, err := s.readOptionReply(proto.OptStructuredReply)
	switch {
	case err != nil:
		return false, err
	case typ == proto.RepAck:
		return true, nil
	case typ&proto.RepFlagError != 0:
		if typ == proto.RepErrShutdown || typ == proto.RepErrTLSReqd {
			return false, s.refused(typ, data, "")
		}
		return false, nil
	}
	return false, fmt.Errorf("%w: reply type %d to NBD_OPT_STRUCTURED_REPLY", ErrProtocol, typ)
}

// optGo asks for the export with NBD_OPT_GO. It returns false, without error, if the server does
// not know the option, so the caller falls back to NBD_OPT_EXPORT_NAME.
func (s *session) optGo(export string) (bool, error) {
	if err := s.sendOption(proto.OptGo, proto.AppendInfoRequest(nil, export, proto.InfoBlockSize)); err != nil {
		return false, err
	}
	gotExport, gotSizes := false, false
	for {
		typ, data, err := s.readOptionReply(proto.OptGo)
		if err != nil {
			return false, err
		}
		switch {
		case typ == proto.RepInfo:
			if len(data) < 2 {
				return false, fmt.Errorf("%w: NBD_REP_INFO of %d bytes", ErrProtocol, len(data))
			}
			switch binary.BigEndian.Uint16(data) {
			case proto.InfoExport:
				if len(data) != 12 {
					return false, fmt.Errorf("%w: NBD_INFO_EXPORT of %d bytes", ErrProtocol, len(data))
				}
				if err := s.setExport(binary.BigEndian.Uint64(data[2:]), binary.BigEndian.Uint16(data[10:])); err != nil {
					return false, err
				}
				gotExport = true
			case proto.InfoBlockSize:
				if len(data) != 14 {
					return false, fmt.Errorf("%w: NBD_INFO_BLOCK_SIZE of %d bytes", ErrProtocol, len(data))
				}
				e := &s.export
				e.MinBlock = binary.BigEndian.Uint32(data[2:])
				e.PrefBlock = binary.BigEndian.Uint32(data[6:])
				e.MaxBlock = binary.BigEndian.Uint32(data[10:])
				gotSizes = true
			}
		case typ == proto.RepAck:
			if !gotExport {
				return false, fmt.Errorf("%w: NBD_OPT_GO succeeded without NBD_INFO_EXPORT", ErrProtocol)
			}
			if !gotSizes {
				s.export.MinBlock, s.export.PrefBlock, s.export.MaxBlock = defaultMinBlock, defaultPreferredBlock, defaultMaxBlock
			}
			return true, s.checkBlockSizes()
		case typ == proto.RepErrUnsup:
			return false, nil
		case typ&proto.RepFlagError != 0:
			return false, s.refused(typ, data, export)
		default:
			return false, fmt.Errorf("%w: reply type %d to NBD_OPT_GO", ErrProtocol, typ)
		}
	}
}

// exportName ends the negotiation the old way. The server answers with the export's size and
// flags, or closes the connection if it does not have the export.
func (s *session) exportName(export string, noZeroes bool) error {
	if err := s.sendOption(proto.OptExportName, []byte(export)); err != nil {
		return err
	}
	n := proto.ExportNameReplySize
	if !noZeroes {
		n += proto.ExportNamePadding
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(s.br, b); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return fmt.Errorf("%w: the server closed the connection when asked for export %q (it probably has no such export)",
				ErrServerRefused, export)
		}
		return err
	}
	s.export.MinBlock, s.export.PrefBlock, s.export.MaxBlock = defaultMinBlock, defaultPreferredBlock, defaultMaxBlock
	return s.setExport(binary.BigEndian.Uint64(b), binary.BigEndian.Uint16(b[8:]))
}

func (s *session) setExport(size uint64, flags uint16) error {
	if size > math.MaxInt64 {
		return fmt.Errorf("%w: export size %d", ErrProtocol, size)
	}
	if flags&proto.FlagHasFlags == 0 {
		flags = 0 // the other bits mean nothing without HAS_FLAGS
	}
	s.export.Size, s.export.Flags = int64(size), flags
	return nil
}

// checkBlockSizes enforces the rules of the protocol's "Size constraints" section that the client
// relies on: a power-of-two minimum of at most 64 KiB, and a maximum no smaller than it.
func (s *session) checkBlockSizes() error {
	e := s.export
	if e.MinBlock == 0 || e.MinBlock > 64<<10 || bits.OnesCount32(e.MinBlock) != 1 || e.MaxBlock < e.MinBlock {
		return fmt.Errorf("%w: block sizes minimum %d preferred %d maximum %d", ErrProtocol, e.MinBlock, e.PrefBlock, e.MaxBlock)
	}
	return nil
}

// refused turns an option error reply into an error, and ends the negotiation politely.
func (s *session) refused(typ uint32, msg []byte, export string) error {
	_ = s.sendOption(proto.OptAbort, nil) // the connection is closed next whatever happens
	why := serverSays(msg)
	switch typ {
	case proto.RepErrUnknown:
		return fmt.Errorf("%w: %q%s", ErrExportNotFound, export, why)
	case proto.RepErrTLSReqd:
		return fmt.Errorf("%w: it requires TLS (ask for it with an nbds:// or nbds+unix:// URL)%s", ErrServerRefused, why)
	case proto.RepErrPolicy:
		return fmt.Errorf("%w: its policy forbids export %q%s", ErrServerRefused, export, why)
	case proto.RepErrShutdown:
		return fmt.Errorf("%w: it is shutting down%s", ErrServerRefused, why)
	}
	return fmt.Errorf("%w: option error %d%s", ErrServerRefused, typ&^proto.RepFlagError, why)
}

// serverSays quotes the message of an option error reply, if it has one, for an error.
func serverSays(msg []byte) string {
	if len(msg) == 0 {
		return ""
	}
	return fmt.Sprintf(" (server says: %q)", msg)
}
