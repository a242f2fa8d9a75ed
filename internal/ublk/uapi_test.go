package ublk

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/abitest"
)

// The layouts of include/uapi/linux/ublk_cmd.h (Linux 6.12):
// each field's offset and each struct's size, as the C compiler lays them out on amd64.
func TestStructLayouts(t *testing.T) {
	abitest.Check(t, []abitest.Struct{
		abitest.Of("ublksrv_ctrl_cmd", ctrlCmd{}, 32, 0, 4, 6, 8, 16, 24, 26, 28),
		abitest.Of("ublksrv_ctrl_dev_info", devInfo{}, 64, 0, 2, 4, 6, 8, 12, 16, 20, 24, 32, 40, 44, 48, 56),
		abitest.Of("ublksrv_io_desc", ioDesc{}, 24, 0, 4, 8, 16),
		abitest.Of("ublksrv_io_cmd", ioCmd{}, 16, 0, 2, 4, 8),
		abitest.Of("ublk_param_basic", paramBasic{}, 32, 0, 4, 5, 6, 7, 8, 12, 16, 24),
		abitest.Of("ublk_param_discard", paramDiscard{}, 20, 0, 4, 8, 12, 16, 18),
		abitest.Of("ublk_param_devt", paramDevt{}, 16, 0, 4, 8, 12),
		abitest.Of("ublk_param_zoned", paramZoned{}, 32, 0, 4, 8, 12),
		abitest.Of("ublk_params", params{}, 112, 0, 4, 8, 40, 60, 76),
	})
	require.Equal(t, uintptr(sizeofCtrlCmd), unsafe.Sizeof(ctrlCmd{}))
	require.Equal(t, uintptr(sizeofIOCmd), unsafe.Sizeof(ioCmd{}))
	require.Equal(t, uintptr(sizeofIODesc), unsafe.Sizeof(ioDesc{}))
	require.Equal(t, uintptr(sizeofParams), unsafe.Sizeof(params{}))
}

// The ioctl-encoded opcodes, as the header's _IOR/_IOWR macros compute them.
func TestOpcodes(t *testing.T) {
	for _, tc := range []struct {
		name string
		got  uint32
		want uint32
	}{
		{"UBLK_U_CMD_GET_DEV_INFO", cmdGetDevInfo, 0x80207502},
		{"UBLK_U_CMD_ADD_DEV", cmdAddDev, 0xc0207504},
		{"UBLK_U_CMD_DEL_DEV", cmdDelDev, 0xc0207505},
		{"UBLK_U_CMD_START_DEV", cmdStartDev, 0xc0207506},
		{"UBLK_U_CMD_STOP_DEV", cmdStopDev, 0xc0207507},
		{"UBLK_U_CMD_SET_PARAMS", cmdSetParams, 0xc0207508},
		{"UBLK_U_CMD_GET_PARAMS", cmdGetParams, 0x80207509},
		{"UBLK_U_CMD_START_USER_RECOVERY", cmdStartUserRecovery, 0xc0207510},
		{"UBLK_U_CMD_END_USER_RECOVERY", cmdEndUserRecovery, 0xc0207511},
		{"UBLK_U_CMD_GET_FEATURES", cmdGetFeatures, 0x80207513},
		{"UBLK_U_CMD_DEL_DEV_ASYNC", cmdDelDevAsync, 0x80207514},
		{"UBLK_U_IO_FETCH_REQ", ioFetchReq, 0xc0107520},
		{"UBLK_U_IO_COMMIT_AND_FETCH_REQ", ioCommitAndFetchRq, 0xc0107521},
	} {
		require.Equal(t, tc.want, tc.got, "%s = %#x, want %#x", tc.name, tc.got, tc.want)
	}
	for op, name := range cmdNames {
		require.NotEmpty(t, name, "%#x", op)
	}
	require.Len(t, cmdNames, 11, "every control command has a name")
}
