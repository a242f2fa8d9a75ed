package server

import (
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"syscall"
	"time"

	"github.com/tierblk/tierblk/internal/nbd/proto"
	"github.com/tierblk/tierblk/internal/tlsconf"
	"github.com/tierblk/tierblk/internal/volume"
	"github.com/tierblk/tierblk/pkg/backend"
)

// handshake runs the fixed newstyle negotiation. It returns true when the client chose an export
// (c.export and the transmission parameters are set), false when the client aborted.
func (c *conn) handshake() (bool, error) {
	// One deadline for the whole negotiation, TLS handshake included: renewed at each option, it
	// would let a client that sends one every little while hold its connection (and a thread) for
	// ever.
	if err := c.setDeadline(time.Now().Add(c.s.handshakeTimeout)); err != nil {
		return false, err
	}
	var b [18]byte
	binary.BigEndian.PutUint64(b[0:], proto.MagicNBD)
	binary.BigEndian.PutUint64(b[8:], proto.MagicIHaveOpt)
	binary.BigEndian.PutUint16(b[16:], proto.HandshakeFlagFixedNewstyle|proto.HandshakeFlagNoZeroes)
	c.bw.Write(b[:])
	if err := c.bw.Flush(); err != nil {
		return false, err
	}
	if _, err := io.ReadFull(c.br, b[:4]); err != nil {
		return false, c.handshakeReadErr(err)
	}
	cflags := binary.BigEndian.Uint32(b[:4])
	if cflags&^(proto.ClientFlagFixedNewstyle|proto.ClientFlagNoZeroes) != 0 {
		return false, protocolErrorf("unknown client flags %#x", cflags)
	}
	c.noZeroes = cflags&proto.ClientFlagNoZeroes != 0
	if cflags&proto.ClientFlagFixedNewstyle == 0 {
		// The protocol allows TLS only after the fixed newstyle negotiation.
		if c.tlsMode == tlsconf.Require {
			return false, &tlsError{"TLS is required, and the client does not speak the fixed newstyle negotiation that starts it"}
		}
		c.tlsMode = tlsconf.Off
	}

	for {
		opt, data, err := c.readOption()
		if err != nil {
			return false, err
		}
		done, err := c.handleOption(opt, data)
		if err == nil {
			err = c.bw.Flush()
		}
		if err != nil || done {
			return c.export != nil, err
		}
	}
}

// readOption reads one option header and its data.
func (c *conn) readOption() (opt uint32, data []byte, err error) {
	var h [proto.OptionHeaderSize]byte
	if _, err := io.ReadFull(c.br, h[:]); err != nil {
		return 0, nil, c.handshakeReadErr(err)
	}
	opt, length, ok := proto.ParseOptionHeader(h[:])
	if !ok {
		return 0, nil, protocolErrorf("bad option magic %#x", h[:8])
	}
	if length > proto.MaxOptionLength {
		// Only a hostile client sends this much: skipping it would let it stream data at us.
		return 0, nil, protocolErrorf("option %d has %d bytes of data, more than %d", opt, length, proto.MaxOptionLength)
	}
	data = make([]byte, length)
	if _, err := io.ReadFull(c.br, data); err != nil {
		return 0, nil, c.handshakeReadErr(err)
	}
	return opt, data, nil
}

func (c *conn) handshakeReadErr(err error) error {
	err = c.readErr(err)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return protocolErrorf("handshake not finished within %v", c.s.handshakeTimeout)
	}
	return err
}

// handleOption answers one option. done is true when the handshake is over: the client chose an
// export or aborted.
func (c *conn) handleOption(opt uint32, data []byte) (done bool, err error) {
	if opt == proto.OptStartTLS {
		return false, c.startTLS(data)
	}
	if c.tlsMode == tlsconf.Require && !c.tlsOn && opt != proto.OptAbort {
		// Nothing but a refusal, so that a client without TLS learns nothing of the exports.
		if !c.tlsWanted {
			c.tlsWanted = true
			c.log.Warn("nbd: refusing options until the client starts TLS, which the server requires", "option", opt)
		}
		if opt == proto.OptExportName {
			// It cannot carry an error: the protocol says to end the session.
			return true, &tlsError{"TLS is required, and the client asked for an export without it (NBD_OPT_EXPORT_NAME)"}
		}
		c.optReply(opt, proto.RepErrTLSReqd, []byte("TLS is required: send NBD_OPT_STARTTLS first"))
		return false, nil
	}
	switch opt {
	case proto.OptExportName:
		e := c.s.byName[string(data)]
		if e == nil {
			// NBD_OPT_EXPORT_NAME cannot carry an error: the protocol says to disconnect.
			return true, protocolErrorf("unknown export %q", data)
		}
		c.enterWith(e, e.Device.Info(), false)
		var b [proto.ExportNameReplySize + proto.ExportNamePadding]byte
		binary.BigEndian.PutUint64(b[0:], uint64(c.info.Size))
		binary.BigEndian.PutUint16(b[8:], c.tflags)
		n := len(b)
		if c.noZeroes {
			n = proto.ExportNameReplySize
		}
		c.bw.Write(b[:n])
		return true, nil

	case proto.OptAbort:
		c.optReply(opt, proto.RepAck, nil)
		return true, nil

	case proto.OptList:
		if len(data) != 0 {
			c.optReply(opt, proto.RepErrInvalid, []byte("NBD_OPT_LIST takes no data"))
			return false, nil
		}
		for i := range c.s.exports {
			e := &c.s.exports[i]
			p := binary.BigEndian.AppendUint32(nil, uint32(len(e.Name)))
			p = append(p, e.Name...)
			p = append(p, e.Description...)
			c.optReply(opt, proto.RepServer, p)
		}
		c.optReply(opt, proto.RepAck, nil)
		return false, nil

	case proto.OptInfo, proto.OptGo:
		return c.handleInfo(opt, data)

	case proto.OptStructuredReply:
		if len(data) != 0 {
			c.optReply(opt, proto.RepErrInvalid, []byte("NBD_OPT_STRUCTURED_REPLY takes no data"))
			return false, nil
		}
		c.structured = true
		c.optReply(opt, proto.RepAck, nil)
		return false, nil

	default:
		// Metadata contexts, extended headers and anything newer.
		c.log.Debug("nbd: unsupported option", "option", opt)
		c.optReply(opt, proto.RepErrUnsup, fmt.Appendf(nil, "option %d is not supported", opt))
		return false, nil
	}
}

// startTLS answers NBD_OPT_STARTTLS and, when it accepts, runs the TLS handshake, after which
// the negotiation starts again over TLS.
func (c *conn) startTLS(data []byte) error {
	const opt = proto.OptStartTLS
	switch {
	case c.tlsMode == tlsconf.Off:
		c.optReply(opt, proto.RepErrPolicy, []byte("TLS is not enabled on this server"))
		return nil
	case c.tlsOn:
		c.optReply(opt, proto.RepErrInvalid, []byte("TLS is already on"))
		return nil
	case len(data) != 0:
		c.optReply(opt, proto.RepErrInvalid, []byte("NBD_OPT_STARTTLS takes no data"))
		return nil
	case c.br.Buffered() > 0:
		// A client waits for the ACK before it starts the handshake. Bytes it sent before would
		// be taken as sent over TLS, where a man in the middle could have put them.
		return protocolErrorf("%d bytes after NBD_OPT_STARTTLS, before its reply", c.br.Buffered())
	}
	c.optReply(opt, proto.RepAck, nil)
	if err := c.bw.Flush(); err != nil {
		return err
	}
	c.wire = &wire{Conn: c.raw}
	tc := tls.Server(c.wire, c.s.tls.Config())
	if err := tc.Handshake(); err != nil {
		if herr := c.handshakeReadErr(err); errors.Is(herr, errShuttingDown) || isProtocolError(herr) {
			return herr // shutting down, or out of time
		}
		return &tlsError{"TLS handshake failed: " + tlsFailure(err)}
	}
	c.stopMu.Lock()
	c.nc = tc
	c.stopMu.Unlock()
	c.src.r = tc
	c.bw.Reset(tc)
	c.tlsOn = true
	// The protocol: nothing negotiated before TLS holds after it.
	c.structured = false
	v := tc.ConnectionState()
	c.log.Debug("nbd: TLS on", "version", tls.VersionName(v.Version), "cipher", tls.CipherSuiteName(v.CipherSuite))
	return nil
}

// tlsFailure says why a TLS handshake failed, in words for whoever reads the server's log: a
// client refuses the server's certificate with an alert, or by hanging up (GnuTLS's clients do),
// which crypto/tls words as an alert or a failed read.
func tlsFailure(err error) string {
	const why = "does it trust the CA that signed the server's certificate, is that certificate in its dates, and issued for the name the client asked for?"
	var op *net.OpError
	switch {
	case errors.As(err, &op) && op.Op == "remote error":
		return fmt.Sprintf("the client refused it (%v): %s", op.Err, why)
	case errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET):
		return fmt.Sprintf("the client hung up during it (%v): %s", err, why)
	}
	return err.Error()
}

// handleInfo answers NBD_OPT_INFO and NBD_OPT_GO; after a successful GO the handshake is over.
func (c *conn) handleInfo(opt uint32, data []byte) (done bool, err error) {
	name, infos, ok := proto.ParseInfoRequest(data)
	if !ok {
		c.optReply(opt, proto.RepErrInvalid, []byte("malformed NBD_OPT_INFO/NBD_OPT_GO data"))
		return false, nil
	}
	e := c.s.byName[name]
	if e == nil {
		c.optReply(opt, proto.RepErrUnknown, fmt.Appendf(nil, "no export named %q", name))
		return false, nil
	}
	info := e.Device.Info()
	tflags := transmissionFlags(info, c.structured)
	minB, prefB, maxB := blockSizes(info)

	var p [14]byte
	binary.BigEndian.PutUint16(p[0:], proto.InfoExport)
	binary.BigEndian.PutUint64(p[2:], uint64(info.Size))
	binary.BigEndian.PutUint16(p[10:], tflags)
	c.optReply(opt, proto.RepInfo, p[:12])
	for _, t := range infos {
		switch t {
		case proto.InfoName:
			c.optReply(opt, proto.RepInfo, append(binary.BigEndian.AppendUint16(nil, proto.InfoName), e.Name...))
		case proto.InfoDescription:
			if e.Description != "" {
				c.optReply(opt, proto.RepInfo, append(binary.BigEndian.AppendUint16(nil, proto.InfoDescription), e.Description...))
			}
		}
	}
	// Block sizes go out whether asked for or not: clients that did not ask may ignore them.
	binary.BigEndian.PutUint16(p[0:], proto.InfoBlockSize)
	binary.BigEndian.PutUint32(p[2:], minB)
	binary.BigEndian.PutUint32(p[6:], prefB)
	binary.BigEndian.PutUint32(p[10:], maxB)
	c.optReply(opt, proto.RepInfo, p[:14])
	c.optReply(opt, proto.RepAck, nil)
	if opt != proto.OptGo {
		return false, nil
	}
	c.enterWith(e, info, slices.Contains(infos, proto.InfoBlockSize))
	return true, nil
}

// optReply queues one option reply; the caller flushes.
func (c *conn) optReply(opt, typ uint32, data []byte) {
	var h [proto.OptionReplyHeaderSize]byte
	proto.PutOptionReplyHeader(h[:], opt, typ, uint32(len(data)))
	c.bw.Write(h[:])
	c.bw.Write(data)
}

// enterWith fixes the export and the transmission parameters for the rest of the connection. A
// client that did not ask for the block sizes (NBD_OPT_EXPORT_NAME, or NBD_OPT_GO without
// NBD_INFO_BLOCK_SIZE) may send requests of any length, which the protocol says a server SHOULD
// then take: up to maxPayload here (nbdkit's limit too), within the connection's payload budget.
func (c *conn) enterWith(e *Export, info volume.Info, sizesAsked bool) {
	c.export = e
	c.waiter, _ = e.Device.(backend.Waiter)
	c.async, _ = e.Device.(backend.AsyncReader)
	c.asyncW, _ = e.Device.(backend.AsyncWriter)
	c.plug, _ = e.Device.(backend.Plugger)
	c.runEnd, _ = e.Device.(backend.RunDeferrer)
	c.info = info
	c.tflags = transmissionFlags(info, c.structured)
	c.minBlock, _, c.maxBlock = blockSizes(info)
	if !sizesAsked {
		c.maxBlock = maxPayload
	}
}

// transmissionFlags are the flags a client sees for a device.
func transmissionFlags(info volume.Info, structured bool) uint16 {
	// FLUSH and CACHE are always understood: on a read-only or uncached volume they succeed
	// without effect.
	f := proto.FlagHasFlags | proto.FlagSendFlush | proto.FlagSendCache
	set := func(cond bool, flag uint16) {
		if cond {
			f |= flag
		}
	}
	set(info.ReadOnly, proto.FlagReadOnly)
	set(info.CanFUA, proto.FlagSendFUA)
	set(info.CanTrim, proto.FlagSendTrim)
	set(info.CanZero, proto.FlagSendWriteZeroes)
	set(info.CanZero && info.CanFastZero, proto.FlagSendFastZero)
	set(info.MultiConn, proto.FlagCanMultiConn)
	set(structured, proto.FlagSendDF)
	return f
}

// blockSizes are the size constraints advertised for a device, with the protocol's defaults for
// what the device leaves unset and the maximum clamped to what the server accepts.
func blockSizes(info volume.Info) (minB, prefB, maxB uint32) {
	minB, prefB, maxB = info.MinBlock, info.PreferredBlock, info.MaxBlock
	if minB == 0 {
		minB = 1
	}
	if prefB == 0 {
		prefB = 4096
	}
	prefB = max(prefB, minB, 512)
	if maxB == 0 {
		maxB = volume.DefaultMaxBlock
	}
	maxB = max(min(maxB, maxPayload), prefB)
	return minB, prefB, maxB
}
