// Package proto is the Network Block Device protocol's wire format (doc/proto.md of
// NetworkBlockDevice/nbd): the magic numbers, flags, options, commands and error values, and the
// encoding and decoding of the protocol's fixed headers, which the server (internal/nbd/server),
// the client (internal/nbd/client) and their tests share, so that the two sides cannot disagree
// on a byte.
//
// It must never do I/O, keep state or decide anything: what to answer, what to trust and when to
// give up on a peer are the server's and the client's. Its decoders read the front of a buffer the
// caller made long enough and report whether the magic number matched; a length that a header
// declares is for the caller to check before it reads or allocates that much.
package proto

// Magic numbers.
const (
	MagicNBD         uint64 = 0x4e42444d41474943 // "NBDMAGIC"
	MagicIHaveOpt    uint64 = 0x49484156454F5054 // "IHAVEOPT"
	MagicOptReply    uint64 = 0x0003e889045565a9
	MagicRequest     uint32 = 0x25609513
	MagicSimpleReply uint32 = 0x67446698
	MagicStructReply uint32 = 0x668e33ef
	// MagicOldstyle is the second word of an oldstyle greeting, which tierblk does not speak.
	MagicOldstyle uint64 = 0x00420281861253
)

// Handshake flags (in the server's greeting) and client flags (the client's answer).
const (
	HandshakeFlagFixedNewstyle uint16 = 1 << 0
	HandshakeFlagNoZeroes      uint16 = 1 << 1
	ClientFlagFixedNewstyle    uint32 = 1 << 0
	ClientFlagNoZeroes         uint32 = 1 << 1
)

// Options.
const (
	OptExportName      uint32 = 1
	OptAbort           uint32 = 2
	OptList            uint32 = 3
	OptStartTLS        uint32 = 5
	OptInfo            uint32 = 6
	OptGo              uint32 = 7
	OptStructuredReply uint32 = 8
	OptListMetaContext uint32 = 9
	OptSetMetaContext  uint32 = 10
)

// Option reply types.
const (
	RepAck         uint32 = 1
	RepServer      uint32 = 2
	RepInfo        uint32 = 3
	RepFlagError   uint32 = 1 << 31
	RepErrUnsup           = RepFlagError | 1
	RepErrPolicy          = RepFlagError | 2
	RepErrInvalid         = RepFlagError | 3
	RepErrPlatform        = RepFlagError | 4
	RepErrTLSReqd         = RepFlagError | 5
	RepErrUnknown         = RepFlagError | 6
	RepErrShutdown        = RepFlagError | 7
	RepErrBlockReq        = RepFlagError | 8
	RepErrTooBig          = RepFlagError | 9
)

// Info types for NBD_OPT_INFO and NBD_OPT_GO.
const (
	InfoExport      uint16 = 0
	InfoName        uint16 = 1
	InfoDescription uint16 = 2
	InfoBlockSize   uint16 = 3
)

// Transmission flags (NBD_FLAG_*): what an export offers, sent with it at the end of the handshake.
const (
	FlagHasFlags        uint16 = 1 << 0
	FlagReadOnly        uint16 = 1 << 1
	FlagSendFlush       uint16 = 1 << 2
	FlagSendFUA         uint16 = 1 << 3
	FlagRotational      uint16 = 1 << 4
	FlagSendTrim        uint16 = 1 << 5
	FlagSendWriteZeroes uint16 = 1 << 6
	FlagSendDF          uint16 = 1 << 7
	FlagCanMultiConn    uint16 = 1 << 8
	FlagSendResize      uint16 = 1 << 9
	FlagSendCache       uint16 = 1 << 10
	FlagSendFastZero    uint16 = 1 << 11
)

// Commands.
const (
	CmdRead        uint16 = 0
	CmdWrite       uint16 = 1
	CmdDisc        uint16 = 2
	CmdFlush       uint16 = 3
	CmdTrim        uint16 = 4
	CmdCache       uint16 = 5
	CmdWriteZeroes uint16 = 6
	CmdBlockStatus uint16 = 7
)

// Command flags.
const (
	CmdFlagFUA      uint16 = 1 << 0
	CmdFlagNoHole   uint16 = 1 << 1
	CmdFlagDF       uint16 = 1 << 2
	CmdFlagReqOne   uint16 = 1 << 3
	CmdFlagFastZero uint16 = 1 << 4
)

// Structured reply flags and types.
const (
	ReplyFlagDone        uint16 = 1 << 0
	ReplyTypeNone        uint16 = 0
	ReplyTypeOffsetData  uint16 = 1
	ReplyTypeOffsetHole  uint16 = 2
	ReplyTypeBlockStatus uint16 = 5
	ReplyTypeError       uint16 = 1<<15 | 1
	ReplyTypeErrorOffset uint16 = 1<<15 | 2
)

// Error values on the wire (Linux errno numbers, as the protocol fixes them).
const (
	ErrnoPerm     uint32 = 1
	ErrnoIO       uint32 = 5
	ErrnoNoMem    uint32 = 12
	ErrnoInval    uint32 = 22
	ErrnoNoSpc    uint32 = 28
	ErrnoOverflow uint32 = 75
	ErrnoNotSup   uint32 = 95
	ErrnoShutdown uint32 = 108
)

// Sizes of fixed wire structures.
const (
	RequestSize      = 28
	SimpleReplySize  = 16
	StructReplySize  = 20
	MaxOptionLength  = 64 << 10 // options carry names and small lists; anything longer is hostile
	MaxExportNameLen = 4096     // the protocol's limit on names and strings
)

// DefaultPort is the IANA port for NBD.
const DefaultPort = 10809
