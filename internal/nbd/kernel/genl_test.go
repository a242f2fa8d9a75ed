package kernel

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/tierblk/tierblk/internal/nbd/proto"
)

// unhex decodes golden bytes written with spaces between groups.
func unhex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.Join(strings.Fields(s), ""))
	require.NoError(t, err)
	return b
}

// needLittleEndian skips golden tests of netlink, whose headers are in the host's byte order.
func needLittleEndian(t *testing.T) {
	if binary.NativeEndian.Uint16([]byte{1, 0}) != 1 {
		t.Skip("golden netlink bytes are little-endian")
	}
}

func TestGenlEncoding(t *testing.T) {
	needLittleEndian(t)
	tests := []struct {
		name string
		got  []byte
		want string
	}{{
		name: "disconnect request",
		got:  genlRequest(0x1a, nbdCmdDisconnect, nbdGenlVersion, 7, disconnectAttrs(3)),
		want: `1c000000 1a00 0500 07000000 00000000  02 01 0000
		       0800 0100 03000000`,
	}, {
		name: "getfamily request: the name is NUL-terminated and padded",
		got:  genlRequest(unix.GENL_ID_CTRL, unix.CTRL_CMD_GETFAMILY, ctrlVersion, 1, nlAttrs(nil).str(unix.CTRL_ATTR_FAMILY_NAME, "nbd")),
		want: `1c000000 1000 0500 01000000 00000000  03 02 0000
		       0800 0200 6e626400`,
	}, {
		name: "string needing padding",
		got:  nlAttrs(nil).str(2, "nbd0"),
		want: `0900 0200 6e62643000 000000`,
	}, {
		name: "connect attributes",
		got: connectAttrs(kernelConfig{
			index: 0, size: 1 << 30, blockSize: 4096, flags: proto.FlagHasFlags | proto.FlagSendFlush | proto.FlagSendFUA | proto.FlagCanMultiConn,
			timeout: 30, deadConnTimeout: 0, fds: []int{5, 6},
		}),
		want: `0800 0100 00000000
		       0c00 0200 00000040 00000000
		       0c00 0300 00100000 00000000
		       0c00 0500 0d010000 00000000
		       0c00 0400 1e000000 00000000
		       0c00 0800 00000000 00000000
		       1c00 0780
		         0c00 0180 0800 0100 05000000
		         0c00 0180 0800 0100 06000000`,
	}, {
		name: "connect attributes with a backend identifier",
		got: connectAttrs(kernelConfig{
			index: 1, size: 1 << 30, blockSize: 512, flags: proto.FlagHasFlags,
			timeout: 30, deadConnTimeout: 120, backend: "tierblk:ab", fds: []int{5},
		}),
		want: `0800 0100 01000000
		       0c00 0200 00000040 00000000
		       0c00 0300 00020000 00000000
		       0c00 0500 01000000 00000000
		       0c00 0400 1e000000 00000000
		       0c00 0800 78000000 00000000
		       0f00 0a00 74696572626c6b3a616200 00
		       1000 0780
		         0c00 0180 0800 0100 05000000`,
	}, {
		name: "reconfigure attributes: index, timeouts, identifier, sockets; no size or flags",
		got: genlRequest(0x1a, nbdCmdReconfigure, nbdGenlVersion, 2, reconfigureAttrs(kernelConfig{
			index: 2, size: 1 << 30, blockSize: 512, flags: proto.FlagHasFlags,
			timeout: 30, deadConnTimeout: 120, backend: "tierblk:ab", fds: []int{7},
		})),
		want: `54000000 1a00 0500 02000000 00000000  03 01 0000
		       0800 0100 02000000
		       0c00 0400 1e000000 00000000
		       0c00 0800 78000000 00000000
		       0f00 0a00 74696572626c6b3a616200 00
		       1000 0780
		         0c00 0180 0800 0100 07000000`,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, unhex(t, tt.want), tt.got)
		})
	}
}

func TestGenlDecoding(t *testing.T) {
	needLittleEndian(t)
	const reqHeader = `1c000000 1a00 0500 07000000 00000000`
	tests := []struct {
		name    string
		in      string
		wantErr string // of parseNetlink
		// of parseAck on the first message, when it is an NLMSG_ERROR
		wantAck   error
		wantTypes []uint16
	}{{
		name:      "ack",
		in:        `24000000 0200 0001 07000000 39300000  00000000 ` + reqHeader,
		wantTypes: []uint16{unix.NLMSG_ERROR},
	}, {
		name: "EBUSY with an extended ack message",
		in: `30000000 0200 0003 07000000 39300000  f0ffffff ` + reqHeader + `
		     0900 0100 62757379 00 000000`,
		wantAck:   &genlError{errno: syscall.EBUSY, msg: "busy"},
		wantTypes: []uint16{unix.NLMSG_ERROR},
	}, {
		name:      "ENOENT without extended ack",
		in:        `24000000 0200 0001 07000000 39300000  feffffff ` + reqHeader,
		wantAck:   &genlError{errno: syscall.ENOENT},
		wantTypes: []uint16{unix.NLMSG_ERROR},
	}, {
		name: "a reply then the ack in one datagram",
		in: `1c000000 1a00 0000 07000000 39300000  01 01 0000  0800 0100 00000000
		     24000000 0200 0001 07000000 39300000  00000000 ` + reqHeader,
		wantTypes: []uint16{0x1a, unix.NLMSG_ERROR},
	}, {
		name:    "truncated header",
		in:      `1c000000 1a00`,
		wantErr: "shorter than a message header",
	}, {
		name:    "length beyond the datagram",
		in:      `40000000 1a00 0000 07000000 39300000`,
		wantErr: "message length 64",
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			msgs, err := parseNetlink(unhex(t, tt.in))
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			var types []uint16
			for _, m := range msgs {
				types = append(types, m.typ)
				require.Equal(t, uint32(7), m.seq)
			}
			require.Equal(t, tt.wantTypes, types)
			last := msgs[len(msgs)-1]
			require.Equal(t, tt.wantAck, parseAck(last))
		})
	}
}

func TestGenlErrorMessages(t *testing.T) {
	e := &genlError{errno: syscall.EBUSY, msg: "busy"}
	require.ErrorIs(t, e, syscall.EBUSY)
	require.Equal(t, "device or resource busy (busy)", e.Error())
	require.Equal(t, "no such file or directory", (&genlError{errno: syscall.ENOENT}).Error())
}

func TestParseAttrs(t *testing.T) {
	needLittleEndian(t)
	tests := []struct {
		name    string
		in      string
		want    map[uint16][]byte
		wantErr string
	}{
		{"u16 padded, nested flag cleared", `0600 0100 1a00 0000  0800 0280 01020304`,
			map[uint16][]byte{1: {0x1a, 0}, 2: {1, 2, 3, 4}}, ""},
		{"last attribute unpadded", `0500 0300 ff`, map[uint16][]byte{3: {0xff}}, ""},
		{"length under the header", `0200 0100`, nil, "attribute length 2"},
		{"length beyond the data", `0c00 0100 00000000`, nil, "attribute length 12"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseAttrs(unhex(t, tt.in))
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}
}

// TestGenlFamilyOnHost asks the host kernel's generic netlink controller, which every Linux has,
// for families: its own (a reply and an ack) and one that no module registers (an error).
func TestGenlFamilyOnHost(t *testing.T) {
	g, err := dialGenl()
	if err != nil {
		t.Skipf("no generic netlink here: %v", err)
	}
	defer g.Close()
	id, err := g.family("nlctrl")
	require.NoError(t, err)
	require.Equal(t, uint16(unix.GENL_ID_CTRL), id)

	_, err = g.family("tbk-nofamily")
	require.True(t, errors.Is(err, errFamilyNotFound), "got %v", err)
	// Names longer than the kernel allows (GENL_NAMSIZ) fail its validation, with a message.
	_, err = g.family("tierblk-no-such-family")
	var ge *genlError
	require.ErrorAs(t, err, &ge)
	require.Equal(t, syscall.EINVAL, ge.errno)
	require.NotEmpty(t, ge.msg)
	// The socket stays usable after errors.
	id, err = g.family("nlctrl")
	require.NoError(t, err)
	require.Equal(t, uint16(unix.GENL_ID_CTRL), id)
}
