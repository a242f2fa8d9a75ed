package ublk

// The kernel's ublk interface, from include/uapi/linux/ublk_cmd.h. Struct layouts must match the
// header byte for byte: uapi_test.go checks their sizes and offsets against the header's values.

// Control commands, issued as URING_CMD on /dev/ublk-control. Only the ioctl-encoded opcodes
// (UBLK_U_CMD_*) are used: kernels built without CONFIG_BLKDEV_UBLK_LEGACY_OPCODES reject the rest.
var (
	cmdGetDevInfo        = ioc(iocRead, 0x02, sizeofCtrlCmd)
	cmdAddDev            = ioc(iocRead|iocWrite, 0x04, sizeofCtrlCmd)
	cmdDelDev            = ioc(iocRead|iocWrite, 0x05, sizeofCtrlCmd)
	cmdStartDev          = ioc(iocRead|iocWrite, 0x06, sizeofCtrlCmd)
	cmdStopDev           = ioc(iocRead|iocWrite, 0x07, sizeofCtrlCmd)
	cmdSetParams         = ioc(iocRead|iocWrite, 0x08, sizeofCtrlCmd)
	cmdGetParams         = ioc(iocRead, 0x09, sizeofCtrlCmd)
	cmdStartUserRecovery = ioc(iocRead|iocWrite, 0x10, sizeofCtrlCmd)
	cmdEndUserRecovery   = ioc(iocRead|iocWrite, 0x11, sizeofCtrlCmd)
	cmdGetFeatures       = ioc(iocRead, 0x13, sizeofCtrlCmd)
	cmdDelDevAsync       = ioc(iocRead, 0x14, sizeofCtrlCmd)
)

// I/O commands, issued as URING_CMD on /dev/ublkcN by each queue's thread.
var (
	ioFetchReq         = ioc(iocRead|iocWrite, 0x20, sizeofIOCmd)
	ioCommitAndFetchRq = ioc(iocRead|iocWrite, 0x21, sizeofIOCmd)
)

// Linux ioctl number encoding (include/uapi/asm-generic/ioctl.h): dir<<30 | size<<16 | type<<8 | nr.
const (
	iocWrite = 1
	iocRead  = 2
	iocType  = 'u'
)

func ioc(dir, nr, size uint32) uint32 {
	return dir<<30 | size<<16 | iocType<<8 | nr
}

// Results of an I/O command's completion (cqe->res).
const (
	ioResOK    = 0
	ioResAbort = -19 // -ENODEV: the device is going away; the tag must not be fetched again
)

// Device feature flags (ublksrv_ctrl_dev_info.flags).
const (
	flagURingCmdCompInTask  = 1 << 1
	flagUserRecovery        = 1 << 3
	flagUserRecoveryReissue = 1 << 4
	flagUnprivilegedDev     = 1 << 5
	flagCmdIoctlEncode      = 1 << 6
	flagUserRecoveryFailIO  = 1 << 9
)

// Device states (ublksrv_ctrl_dev_info.state).
const (
	stateDead     = 0
	stateLive     = 1
	stateQuiesced = 2
	stateFailIO   = 3
)

// Request operations (low 8 bits of ublksrv_io_desc.op_flags) and flags (the rest).
const (
	opRead        = 0
	opWrite       = 1
	opFlush       = 2
	opDiscard     = 3
	opWriteZeroes = 5

	ioFlagFUA     = 1 << 13
	ioFlagNoUnmap = 1 << 15
)

// Parameter types and basic attributes (struct ublk_params).
const (
	paramTypeBasic   = 1 << 0
	paramTypeDiscard = 1 << 1

	attrReadOnly      = 1 << 0
	attrVolatileCache = 1 << 2
	attrFUA           = 1 << 3
)

// Where the per-queue io descriptor arrays are mmapped from /dev/ublkcN: queue q's array is at
// q * the size of the largest possible one (UBLK_MAX_QUEUE_DEPTH descriptors, page aligned).
const (
	maxQueueDepth = 4096
	sectorShift   = 9
)

// ctrlCmd is struct ublksrv_ctrl_cmd, carried in the 80-byte command area of a 128-byte SQE.
type ctrlCmd struct {
	DevID      uint32
	QueueID    uint16 // 0xffff unless the command is for one queue
	Len        uint16
	Addr       uint64
	Data       uint64
	DevPathLen uint16
	Pad        uint16
	Reserved   uint32
}

const sizeofCtrlCmd = 32

// devInfo is struct ublksrv_ctrl_dev_info.
type devInfo struct {
	NrHWQueues    uint16
	QueueDepth    uint16
	State         uint16
	Pad0          uint16
	MaxIOBufBytes uint32
	DevID         uint32
	UblksrvPID    int32
	Pad1          uint32
	Flags         uint64
	UblksrvFlags  uint64
	OwnerUID      uint32
	OwnerGID      uint32
	Reserved1     uint64
	Reserved2     uint64
}

// ioDesc is struct ublksrv_io_desc: what the kernel asks of one tag, in the mmapped array.
type ioDesc struct {
	OpFlags     uint32
	NrSectors   uint32
	StartSector uint64
	Addr        uint64
}

const sizeofIODesc = 24

// ioCmd is struct ublksrv_io_cmd, carried in the 16-byte command area of a 64-byte SQE.
type ioCmd struct {
	QID    uint16
	Tag    uint16
	Result int32
	Addr   uint64
}

const sizeofIOCmd = 16

// paramBasic is struct ublk_param_basic.
type paramBasic struct {
	Attrs            uint32
	LogicalBSShift   uint8
	PhysicalBSShift  uint8
	IOOptShift       uint8
	IOMinShift       uint8
	MaxSectors       uint32
	ChunkSectors     uint32
	DevSectors       uint64
	VirtBoundaryMask uint64
}

// paramDiscard is struct ublk_param_discard.
type paramDiscard struct {
	DiscardAlignment      uint32
	DiscardGranularity    uint32
	MaxDiscardSectors     uint32
	MaxWriteZeroesSectors uint32
	MaxDiscardSegments    uint16
	Reserved0             uint16
}

// paramDevt is struct ublk_param_devt (read-only: GET_PARAMS fills it in).
type paramDevt struct {
	CharMajor, CharMinor, DiskMajor, DiskMinor uint32
}

// paramZoned is struct ublk_param_zoned, unused but part of the 6.12 layout.
type paramZoned struct {
	MaxOpenZones         uint32
	MaxActiveZones       uint32
	MaxZoneAppendSectors uint32
	Reserved             [20]byte
}

// params is struct ublk_params as Linux 6.12 has it. Later kernels append members; Len tells
// them which version this is, and they accept the shorter one.
type params struct {
	Len     uint32
	Types   uint32
	Basic   paramBasic
	Discard paramDiscard
	Devt    paramDevt
	Zoned   paramZoned
}

const sizeofParams = 112
