package nbd

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"net"
	"time"
)

// magicOldstyle is the second word of an oldstyle greeting, which this client does not speak.
const magicOldstyle uint64 = 0x00420281861253

// clientSession is one negotiated connection, ready for the transmission phase.
type clientSession struct {
	nc         net.Conn
	br         *bufio.Reader
	export     clientExport
	structured bool
}

// connect dials the server and negotiates the export. Close or ctx abort it.
func (c *Client) connect(ctx context.Context) (*clientSession, error) {
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
	s, err := clientHandshake(nc, c.cfg.Export, true)
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

// clientHandshake runs the fixed newstyle negotiation: structured replies if structured asks for
// them and the server has them, then NBD_OPT_GO asking for block sizes, or NBD_OPT_EXPORT_NAME for
// servers too old for GO. The kernel's client, which takes over some sessions, knows only simple
// replies.
func clientHandshake(nc net.Conn, export string, structured bool) (*clientSession, error) {
	if len(export) > maxExportNameLen {
		return nil, fmt.Errorf("export name is %d bytes; the protocol allows %d", len(export), maxExportNameLen)
	}
	s := &clientSession{nc: nc, br: bufio.NewReaderSize(nc, 64<<10)}
	var greeting [18]byte
	if _, err := io.ReadFull(s.br, greeting[:]); err != nil {
		return nil, fmt.Errorf("%w: no NBD greeting: %w", ErrNotNBDServer, err)
	}
	if binary.BigEndian.Uint64(greeting[0:]) != magicNBD {
		return nil, fmt.Errorf("%w: it greeted with %q", ErrNotNBDServer, greeting[:8])
	}
	switch binary.BigEndian.Uint64(greeting[8:]) {
	case magicIHaveOpt:
	case magicOldstyle:
		return nil, fmt.Errorf("%w: the server uses the oldstyle handshake; configure it for newstyle", ErrServerRefused)
	default:
		return nil, fmt.Errorf("%w: unknown handshake magic %#x", ErrNotNBDServer, greeting[8:16])
	}
	hflags := binary.BigEndian.Uint16(greeting[16:])
	var cflags uint32
	if hflags&flagFixedNewstyle != 0 {
		cflags |= cflagFixedNewstyle
	}
	noZeroes := hflags&flagNoZeroes != 0
	if noZeroes {
		cflags |= cflagNoZeroes
	}
	if _, err := nc.Write(binary.BigEndian.AppendUint32(nil, cflags)); err != nil {
		return nil, err
	}
	if hflags&flagFixedNewstyle == 0 {
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

// sendOption writes one option request.
func (s *clientSession) sendOption(opt uint32, data []byte) error {
	b := make([]byte, optionHeaderSize, optionHeaderSize+len(data))
	putOptionHeader(b, opt, uint32(len(data)))
	_, err := s.nc.Write(append(b, data...))
	return err
}

// readOptionReply reads one option reply to opt and returns its type and data.
func (s *clientSession) readOptionReply(opt uint32) (uint32, []byte, error) {
	var h [optionReplyHeaderSize]byte
	if _, err := io.ReadFull(s.br, h[:]); err != nil {
		return 0, nil, fmt.Errorf("reading the reply to option %d: %w", opt, err)
	}
	o, typ, n, ok := parseOptionReplyHeader(h[:])
	if !ok {
		return 0, nil, fmt.Errorf("%w: option reply magic %#x", ErrProtocol, h[:8])
	}
	if o != opt {
		return 0, nil, fmt.Errorf("%w: reply to option %d while option %d was asked", ErrProtocol, o, opt)
	}
	if n > maxOptionLength {
		return 0, nil, fmt.Errorf("%w: option reply of %d bytes", ErrProtocol, n)
	}
	data := make([]byte, n)
	if _, err := io.ReadFull(s.br, data); err != nil {
		return 0, nil, fmt.Errorf("reading the reply to option %d: %w", opt, err)
	}
	return typ, data, nil
}

// optStructuredReply asks for structured replies; a server without them is fine.
func (s *clientSession) optStructuredReply() (bool, error) {
	if err := s.sendOption(optStructuredReply, nil); err != nil {
		return false, err
	}
	typ, data, err := s.readOptionReply(optStructuredReply)
	switch {
	case err != nil:
		return false, err
	case typ == repAck:
		return true, nil
	case typ&repFlagError != 0:
		if typ == repErrShutdown || typ == repErrTLSReqd {
			return false, s.refused(typ, data, "")
		}
		return false, nil
	}
	return false, fmt.Errorf("%w: reply type %d to NBD_OPT_STRUCTURED_REPLY", ErrProtocol, typ)
}

// optGo asks for the export with NBD_OPT_GO. It returns false, without error, if the server does
// not know the option, so the caller falls back to NBD_OPT_EXPORT_NAME.
func (s *clientSession) optGo(export string) (bool, error) {
	if err := s.sendOption(optGo, appendInfoRequest(nil, export, infoBlockSize)); err != nil {
		return false, err
	}
	gotExport, gotSizes := false, false
	for {
		typ, data, err := s.readOptionReply(optGo)
		if err != nil {
			return false, err
		}
		switch {
		case typ == repInfo:
			if len(data) < 2 {
				return false, fmt.Errorf("%w: NBD_REP_INFO of %d bytes", ErrProtocol, len(data))
			}
			switch binary.BigEndian.Uint16(data) {
			case infoExport:
				if len(data) != 12 {
					return false, fmt.Errorf("%w: NBD_INFO_EXPORT of %d bytes", ErrProtocol, len(data))
				}
				if err := s.setExport(binary.BigEndian.Uint64(data[2:]), binary.BigEndian.Uint16(data[10:])); err != nil {
					return false, err
				}
				gotExport = true
			case infoBlockSize:
				if len(data) != 14 {
					return false, fmt.Errorf("%w: NBD_INFO_BLOCK_SIZE of %d bytes", ErrProtocol, len(data))
				}
				e := &s.export
				e.minBlock = binary.BigEndian.Uint32(data[2:])
				e.prefBlock = binary.BigEndian.Uint32(data[6:])
				e.maxBlock = binary.BigEndian.Uint32(data[10:])
				gotSizes = true
			}
		case typ == repAck:
			if !gotExport {
				return false, fmt.Errorf("%w: NBD_OPT_GO succeeded without NBD_INFO_EXPORT", ErrProtocol)
			}
			if !gotSizes {
				s.export.minBlock, s.export.prefBlock, s.export.maxBlock = defaultMinBlock, defaultPreferredBlock, defaultMaxBlock
			}
			return true, s.checkBlockSizes()
		case typ == repErrUnsup:
			return false, nil
		case typ&repFlagError != 0:
			return false, s.refused(typ, data, export)
		default:
			return false, fmt.Errorf("%w: reply type %d to NBD_OPT_GO", ErrProtocol, typ)
		}
	}
}

// exportName ends the negotiation the old way. The server answers with the export's size and
// flags, or closes the connection if it does not have the export.
func (s *clientSession) exportName(export string, noZeroes bool) error {
	if err := s.sendOption(optExportName, []byte(export)); err != nil {
		return err
	}
	n := exportNameReplySize
	if !noZeroes {
		n += exportNamePadding
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(s.br, b); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return fmt.Errorf("%w: the server closed the connection when asked for export %q (it probably has no such export)",
				ErrServerRefused, export)
		}
		return err
	}
	s.export.minBlock, s.export.prefBlock, s.export.maxBlock = defaultMinBlock, defaultPreferredBlock, defaultMaxBlock
	return s.setExport(binary.BigEndian.Uint64(b), binary.BigEndian.Uint16(b[8:]))
}

func (s *clientSession) setExport(size uint64, flags uint16) error {
	if size > math.MaxInt64 {
		return fmt.Errorf("%w: export size %d", ErrProtocol, size)
	}
	if flags&tflagHasFlags == 0 {
		flags = 0 // the other bits mean nothing without HAS_FLAGS
	}
	s.export.size, s.export.flags = int64(size), flags
	return nil
}

// checkBlockSizes enforces the rules of the protocol's "Size constraints" section that the client
// relies on: a power-of-two minimum of at most 64 KiB, and a maximum no smaller than it.
func (s *clientSession) checkBlockSizes() error {
	e := s.export
	if e.minBlock == 0 || e.minBlock > 64<<10 || bits.OnesCount32(e.minBlock) != 1 || e.maxBlock < e.minBlock {
		return fmt.Errorf("%w: block sizes minimum %d preferred %d maximum %d", ErrProtocol, e.minBlock, e.prefBlock, e.maxBlock)
	}
	return nil
}

// refused turns an option error reply into an error, and ends the negotiation politely.
func (s *clientSession) refused(typ uint32, msg []byte, export string) error {
	_ = s.sendOption(optAbort, nil) // the connection is closed next whatever happens
	why := ""
	if len(msg) > 0 {
		why = fmt.Sprintf(" (server says: %q)", msg)
	}
	switch typ {
	case repErrUnknown:
		return fmt.Errorf("%w: %q%s", ErrExportNotFound, export, why)
	case repErrTLSReqd:
		return fmt.Errorf("%w: it requires TLS, which this client does not support%s", ErrServerRefused, why)
	case repErrPolicy:
		return fmt.Errorf("%w: its policy forbids export %q%s", ErrServerRefused, export, why)
	case repErrShutdown:
		return fmt.Errorf("%w: it is shutting down%s", ErrServerRefused, why)
	}
	return fmt.Errorf("%w: option error %d%s", ErrServerRefused, typ&^repFlagError, why)
}
