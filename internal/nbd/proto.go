// Package nbd implements the Network Block Device protocol (doc/proto.md of NetworkBlockDevice/nbd):
// the fixed-newstyle handshake, the transmission phase with simple and structured replies, a
// concurrent server that serves a volume.Device, a pipelined client, and the attachment of the
// Linux kernel's NBD client (/dev/nbdN) to an export over generic netlink (kernel.go, genl.go).
//
// The server must never let one connection's bad input harm another connection or write anything
// a client did not ask for: malformed requests get an error reply or a closed connection. A
// kernel device must never be left attached to connections nobody serves while the server lives:
// Detach releases it, and a device left by a dead process is released before it is taken again.
package nbd

// Magic numbers.
const (
	magicNBD         uint64 = 0x4e42444d41474943 // "NBDMAGIC"
	magicIHaveOpt    uint64 = 0x49484156454F5054 // "IHAVEOPT"
	magicOptReply    uint64 = 0x0003e889045565a9
	magicRequest     uint32 = 0x25609513
	magicSimpleReply uint32 = 0x67446698
	magicStructReply uint32 = 0x668e33ef
)

// Handshake flags (server) and client flags.
const (
	flagFixedNewstyle  uint16 = 1 << 0
	flagNoZeroes       uint16 = 1 << 1
	cflagFixedNewstyle uint32 = 1 << 0
	cflagNoZeroes      uint32 = 1 << 1
)

// Options.
const (
	optExportName      uint32 = 1
	optAbort           uint32 = 2
	optList            uint32 = 3
	optStartTLS        uint32 = 5
	optInfo            uint32 = 6
	optGo              uint32 = 7
	optStructuredReply uint32 = 8
	optListMetaContext uint32 = 9
	optSetMetaContext  uint32 = 10
)

// Option reply types.
const (
	repAck         uint32 = 1
	repServer      uint32 = 2
	repInfo        uint32 = 3
	repFlagError   uint32 = 1 << 31
	repErrUnsup           = repFlagError | 1
	repErrPolicy          = repFlagError | 2
	repErrInvalid         = repFlagError | 3
	repErrPlatform        = repFlagError | 4
	repErrTLSReqd         = repFlagError | 5
	repErrUnknown         = repFlagError | 6
	repErrShutdown        = repFlagError | 7
	repErrBlockReq        = repFlagError | 8
	repErrTooBig          = repFlagError | 9
)

// Info types for NBD_OPT_INFO and NBD_OPT_GO.
const (
	infoExport      uint16 = 0
	infoName        uint16 = 1
	infoDescription uint16 = 2
	infoBlockSize   uint16 = 3
)

// Transmission flags.
const (
	tflagHasFlags        uint16 = 1 << 0
	tflagReadOnly        uint16 = 1 << 1
	tflagSendFlush       uint16 = 1 << 2
	tflagSendFUA         uint16 = 1 << 3
	tflagRotational      uint16 = 1 << 4
	tflagSendTrim        uint16 = 1 << 5
	tflagSendWriteZeroes uint16 = 1 << 6
	tflagSendDF          uint16 = 1 << 7
	tflagCanMultiConn    uint16 = 1 << 8
	tflagSendResize      uint16 = 1 << 9
	tflagSendCache       uint16 = 1 << 10
	tflagSendFastZero    uint16 = 1 << 11
)

// Commands.
const (
	cmdRead        uint16 = 0
	cmdWrite       uint16 = 1
	cmdDisc        uint16 = 2
	cmdFlush       uint16 = 3
	cmdTrim        uint16 = 4
	cmdCache       uint16 = 5
	cmdWriteZeroes uint16 = 6
	cmdBlockStatus uint16 = 7
)

// Command flags.
const (
	cmdFlagFUA      uint16 = 1 << 0
	cmdFlagNoHole   uint16 = 1 << 1
	cmdFlagDF       uint16 = 1 << 2
	cmdFlagReqOne   uint16 = 1 << 3
	cmdFlagFastZero uint16 = 1 << 4
)

// Structured reply flags and types.
const (
	replyFlagDone        uint16 = 1 << 0
	replyTypeNone        uint16 = 0
	replyTypeOffsetData  uint16 = 1
	replyTypeOffsetHole  uint16 = 2
	replyTypeBlockStatus uint16 = 5
	replyTypeError       uint16 = 1<<15 | 1
	replyTypeErrorOffset uint16 = 1<<15 | 2
)

// Error values on the wire (Linux errno numbers, as the protocol fixes them).
const (
	errPerm     uint32 = 1
	errIO       uint32 = 5
	errNoMem    uint32 = 12
	errInval    uint32 = 22
	errNoSpc    uint32 = 28
	errOverflow uint32 = 75
	errNotSup   uint32 = 95
	errShutdown uint32 = 108
)

// Sizes of fixed wire structures.
const (
	requestSize      = 28
	simpleReplySize  = 16
	structReplySize  = 20
	maxOptionLength  = 64 << 10 // options carry names and small lists; anything longer is hostile
	maxExportNameLen = 4096     // the protocol's limit on names and strings
)

// DefaultPort is the IANA port for NBD.
const DefaultPort = 10809
