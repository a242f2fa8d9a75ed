package proto

import "encoding/binary"

// Encoders and decoders for the fixed-size headers of the protocol, shared by the server, the
// client and the tests. Each Put function writes into the front of b, which must be long enough;
// each Parse function reads the front of b and reports whether the magic number matched.

// Sizes of the handshake headers (the transmission ones are in proto.go).
const (
	OptionHeaderSize      = 16 // magic, option, length
	OptionReplyHeaderSize = 20 // magic, option, reply type, length
	ExportNameReplySize   = 10 // size, transmission flags (then 124 zeroes unless NO_ZEROES)
	ExportNamePadding     = 124
)

// Request is a transmission-phase request header; a WRITE's payload follows it on the wire.
type Request struct {
	Flags  uint16 // command flags (CmdFlag*)
	Type   uint16 // the command (Cmd*)
	Cookie uint64 // chosen by the client, echoed in the reply
	Offset uint64
	Length uint32
}

// PutRequest encodes r into b[:RequestSize].
func PutRequest(b []byte, r Request) {
	_ = b[RequestSize-1]
	binary.BigEndian.PutUint32(b[0:], MagicRequest)
	binary.BigEndian.PutUint16(b[4:], r.Flags)
	binary.BigEndian.PutUint16(b[6:], r.Type)
	binary.BigEndian.PutUint64(b[8:], r.Cookie)
	binary.BigEndian.PutUint64(b[16:], r.Offset)
	binary.BigEndian.PutUint32(b[24:], r.Length)
}

// ParseRequest decodes b[:RequestSize].
func ParseRequest(b []byte) (r Request, ok bool) {
	_ = b[RequestSize-1]
	if binary.BigEndian.Uint32(b[0:]) != MagicRequest {
		return Request{}, false
	}
	return Request{
		Flags:  binary.BigEndian.Uint16(b[4:]),
		Type:   binary.BigEndian.Uint16(b[6:]),
		Cookie: binary.BigEndian.Uint64(b[8:]),
		Offset: binary.BigEndian.Uint64(b[16:]),
		Length: binary.BigEndian.Uint32(b[24:]),
	}, true
}

// PutSimpleReply encodes a simple reply header into b[:SimpleReplySize]. A successful READ's
// data follows it.
func PutSimpleReply(b []byte, errno uint32, cookie uint64) {
	_ = b[SimpleReplySize-1]
	binary.BigEndian.PutUint32(b[0:], MagicSimpleReply)
	binary.BigEndian.PutUint32(b[4:], errno)
	binary.BigEndian.PutUint64(b[8:], cookie)
}

// ParseSimpleReply decodes b[:SimpleReplySize].
func ParseSimpleReply(b []byte) (errno uint32, cookie uint64, ok bool) {
	_ = b[SimpleReplySize-1]
	if binary.BigEndian.Uint32(b[0:]) != MagicSimpleReply {
		return 0, 0, false
	}
	return binary.BigEndian.Uint32(b[4:]), binary.BigEndian.Uint64(b[8:]), true
}

// ChunkHeader is the header of one structured reply chunk; Length bytes of payload follow it.
type ChunkHeader struct {
	Flags  uint16 // ReplyFlagDone on a reply's last chunk
	Type   uint16 // ReplyType*
	Cookie uint64
	Length uint32
}

// PutChunkHeader encodes h into b[:StructReplySize].
func PutChunkHeader(b []byte, h ChunkHeader) {
	_ = b[StructReplySize-1]
	binary.BigEndian.PutUint32(b[0:], MagicStructReply)
	binary.BigEndian.PutUint16(b[4:], h.Flags)
	binary.BigEndian.PutUint16(b[6:], h.Type)
	binary.BigEndian.PutUint64(b[8:], h.Cookie)
	binary.BigEndian.PutUint32(b[16:], h.Length)
}

// ParseChunkHeader decodes b[:StructReplySize].
func ParseChunkHeader(b []byte) (h ChunkHeader, ok bool) {
	_ = b[StructReplySize-1]
	if binary.BigEndian.Uint32(b[0:]) != MagicStructReply {
		return ChunkHeader{}, false
	}
	return ChunkHeader{
		Flags:  binary.BigEndian.Uint16(b[4:]),
		Type:   binary.BigEndian.Uint16(b[6:]),
		Cookie: binary.BigEndian.Uint64(b[8:]),
		Length: binary.BigEndian.Uint32(b[16:]),
	}, true
}

// PutOptionHeader encodes a client's option header into b[:OptionHeaderSize]; length bytes of
// option data follow it.
func PutOptionHeader(b []byte, opt, length uint32) {
	_ = b[OptionHeaderSize-1]
	binary.BigEndian.PutUint64(b[0:], MagicIHaveOpt)
	binary.BigEndian.PutUint32(b[8:], opt)
	binary.BigEndian.PutUint32(b[12:], length)
}

// ParseOptionHeader decodes b[:OptionHeaderSize].
func ParseOptionHeader(b []byte) (opt, length uint32, ok bool) {
	_ = b[OptionHeaderSize-1]
	if binary.BigEndian.Uint64(b[0:]) != MagicIHaveOpt {
		return 0, 0, false
	}
	return binary.BigEndian.Uint32(b[8:]), binary.BigEndian.Uint32(b[12:]), true
}

// PutOptionReplyHeader encodes a server's option reply header into b[:OptionReplyHeaderSize];
// length bytes of reply data follow it.
func PutOptionReplyHeader(b []byte, opt, typ, length uint32) {
	_ = b[OptionReplyHeaderSize-1]
	binary.BigEndian.PutUint64(b[0:], MagicOptReply)
	binary.BigEndian.PutUint32(b[8:], opt)
	binary.BigEndian.PutUint32(b[12:], typ)
	binary.BigEndian.PutUint32(b[16:], length)
}

// ParseOptionReplyHeader decodes b[:OptionReplyHeaderSize].
func ParseOptionReplyHeader(b []byte) (opt, typ, length uint32, ok bool) {
	_ = b[OptionReplyHeaderSize-1]
	if binary.BigEndian.Uint64(b[0:]) != MagicOptReply {
		return 0, 0, 0, false
	}
	return binary.BigEndian.Uint32(b[8:]), binary.BigEndian.Uint32(b[12:]), binary.BigEndian.Uint32(b[16:]), true
}

// AppendInfoRequest appends the data of an NBD_OPT_INFO or NBD_OPT_GO option: the export name
// and the information types asked for.
func AppendInfoRequest(b []byte, name string, infos ...uint16) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(name)))
	b = append(b, name...)
	b = binary.BigEndian.AppendUint16(b, uint16(len(infos)))
	for _, t := range infos {
		b = binary.BigEndian.AppendUint16(b, t)
	}
	return b
}

// ParseInfoRequest decodes the data of an NBD_OPT_INFO or NBD_OPT_GO option. ok is false when the
// lengths inside disagree with the option's length.
func ParseInfoRequest(data []byte) (name string, infos []uint16, ok bool) {
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
