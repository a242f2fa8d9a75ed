package nbd

import "encoding/binary"

// Encoders and decoders for the fixed-size headers of the protocol, shared by the server, the
// client and the tests. Each put* function writes into the front of b, which must be long enough;
// each parse* function reads the front of b and reports whether the magic number matched.

// Sizes of the handshake headers (the transmission ones are in proto.go).
const (
	optionHeaderSize      = 16 // magic, option, length
	optionReplyHeaderSize = 20 // magic, option, reply type, length
	exportNameReplySize   = 10 // size, transmission flags (then 124 zeroes unless NO_ZEROES)
	exportNamePadding     = 124
)

// request is a transmission-phase request header; a WRITE's payload follows it on the wire.
type request struct {
	flags  uint16
	typ    uint16
	cookie uint64
	offset uint64
	length uint32
}

// putRequest encodes r into b[:requestSize].
func putRequest(b []byte, r request) {
	_ = b[requestSize-1]
	binary.BigEndian.PutUint32(b[0:], magicRequest)
	binary.BigEndian.PutUint16(b[4:], r.flags)
	binary.BigEndian.PutUint16(b[6:], r.typ)
	binary.BigEndian.PutUint64(b[8:], r.cookie)
	binary.BigEndian.PutUint64(b[16:], r.offset)
	binary.BigEndian.PutUint32(b[24:], r.length)
}

// parseRequest decodes b[:requestSize].
func parseRequest(b []byte) (r request, ok bool) {
	_ = b[requestSize-1]
	if binary.BigEndian.Uint32(b[0:]) != magicRequest {
		return request{}, false
	}
	return request{
		flags:  binary.BigEndian.Uint16(b[4:]),
		typ:    binary.BigEndian.Uint16(b[6:]),
		cookie: binary.BigEndian.Uint64(b[8:]),
		offset: binary.BigEndian.Uint64(b[16:]),
		length: binary.BigEndian.Uint32(b[24:]),
	}, true
}

// putSimpleReply encodes a simple reply header into b[:simpleReplySize]. A successful READ's
// data follows it.
func putSimpleReply(b []byte, errno uint32, cookie uint64) {
	_ = b[simpleReplySize-1]
	binary.BigEndian.PutUint32(b[0:], magicSimpleReply)
	binary.BigEndian.PutUint32(b[4:], errno)
	binary.BigEndian.PutUint64(b[8:], cookie)
}

// parseSimpleReply decodes b[:simpleReplySize].
func parseSimpleReply(b []byte) (errno uint32, cookie uint64, ok bool) {
	_ = b[simpleReplySize-1]
	if binary.BigEndian.Uint32(b[0:]) != magicSimpleReply {
		return 0, 0, false
	}
	return binary.BigEndian.Uint32(b[4:]), binary.BigEndian.Uint64(b[8:]), true
}

// chunkHeader is the header of one structured reply chunk; length bytes of payload follow it.
type chunkHeader struct {
	flags  uint16
	typ    uint16
	cookie uint64
	length uint32
}

// putChunkHeader encodes h into b[:structReplySize].
func putChunkHeader(b []byte, h chunkHeader) {
	_ = b[structReplySize-1]
	binary.BigEndian.PutUint32(b[0:], magicStructReply)
	binary.BigEndian.PutUint16(b[4:], h.flags)
	binary.BigEndian.PutUint16(b[6:], h.typ)
	binary.BigEndian.PutUint64(b[8:], h.cookie)
	binary.BigEndian.PutUint32(b[16:], h.length)
}

// parseChunkHeader decodes b[:structReplySize].
func parseChunkHeader(b []byte) (h chunkHeader, ok bool) {
	_ = b[structReplySize-1]
	if binary.BigEndian.Uint32(b[0:]) != magicStructReply {
		return chunkHeader{}, false
	}
	return chunkHeader{
		flags:  binary.BigEndian.Uint16(b[4:]),
		typ:    binary.BigEndian.Uint16(b[6:]),
		cookie: binary.BigEndian.Uint64(b[8:]),
		length: binary.BigEndian.Uint32(b[16:]),
	}, true
}

// putOptionHeader encodes a client's option header into b[:optionHeaderSize]; length bytes of
// option data follow it.
func putOptionHeader(b []byte, opt, length uint32) {
	_ = b[optionHeaderSize-1]
	binary.BigEndian.PutUint64(b[0:], magicIHaveOpt)
	binary.BigEndian.PutUint32(b[8:], opt)
	binary.BigEndian.PutUint32(b[12:], length)
}

// parseOptionHeader decodes b[:optionHeaderSize].
func parseOptionHeader(b []byte) (opt, length uint32, ok bool) {
	_ = b[optionHeaderSize-1]
	if binary.BigEndian.Uint64(b[0:]) != magicIHaveOpt {
		return 0, 0, false
	}
	return binary.BigEndian.Uint32(b[8:]), binary.BigEndian.Uint32(b[12:]), true
}

// putOptionReplyHeader encodes a server's option reply header into b[:optionReplyHeaderSize];
// length bytes of reply data follow it.
func putOptionReplyHeader(b []byte, opt, typ, length uint32) {
	_ = b[optionReplyHeaderSize-1]
	binary.BigEndian.PutUint64(b[0:], magicOptReply)
	binary.BigEndian.PutUint32(b[8:], opt)
	binary.BigEndian.PutUint32(b[12:], typ)
	binary.BigEndian.PutUint32(b[16:], length)
}

// parseOptionReplyHeader decodes b[:optionReplyHeaderSize].
func parseOptionReplyHeader(b []byte) (opt, typ, length uint32, ok bool) {
	_ = b[optionReplyHeaderSize-1]
	if binary.BigEndian.Uint64(b[0:]) != magicOptReply {
		return 0, 0, 0, false
	}
	return binary.BigEndian.Uint32(b[8:]), binary.BigEndian.Uint32(b[12:]), binary.BigEndian.Uint32(b[16:]), true
}

// appendInfoRequest appends the data of an NBD_OPT_INFO or NBD_OPT_GO option: the export name
// and the information types asked for.
func appendInfoRequest(b []byte, name string, infos ...uint16) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(name)))
	b = append(b, name...)
	b = binary.BigEndian.AppendUint16(b, uint16(len(infos)))
	for _, t := range infos {
		b = binary.BigEndian.AppendUint16(b, t)
	}
	return b
}

// parseInfoRequest decodes the data of an NBD_OPT_INFO or NBD_OPT_GO option. ok is false when the
// lengths inside disagree with the option's length.
func parseInfoRequest(data []byte) (name string, infos []uint16, ok bool) {
	if len(data) < 6 {
		return "", nil, false
	}
	n := binary.BigEndian.Uint32(data)
	if uint64(n) > uint64(len(data)-6) {
		return "", nil, false
	}
	name = string(data[4 : 4+n])
	rest := data[4+n:]
	count := int(binary.BigEndian.Uint16(rest))
	rest = rest[2:]
	if len(rest) != 2*count {
		return "", nil, false
	}
	infos = make([]uint16, count)
	for i := range infos {
		infos[i] = binary.BigEndian.Uint16(rest[2*i:])
	}
	return name, infos, true
}
