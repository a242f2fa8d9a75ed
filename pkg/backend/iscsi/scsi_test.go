package iscsi

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestCDBs(t *testing.T) {
	require.Equal(t, []byte{0x12, 1, 0xb0, 0, 64, 0}, cdbInquiry(0xb0, true, 64))
	require.Equal(t, []byte{0x9e, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0}, cdbReadCapacity16(32))
	require.Equal(t, []byte{0x8a, 0x08, 0, 0, 0, 0, 0, 0, 0x12, 0x34, 0, 0, 0, 8, 0, 0}, cdbBlocks(scsiWrite16, cdbFUA, 0x1234, 8))
	require.Equal(t, []byte{0x1a, 0x08, 0x3f, 0, 4, 0}, cdbModeSense6(0x3f, 4))
	require.Equal(t, []byte{0x42, 0, 0, 0, 0, 0, 0, 0, 40, 0}, cdbUnmap(40))
	list := unmapList([][2]uint64{{1, 2}, {1 << 40, 3}})
	require.Len(t, list, 40)
	require.Equal(t, uint16(38), binary.BigEndian.Uint16(list))
	require.Equal(t, uint16(32), binary.BigEndian.Uint16(list[2:]))
	require.Equal(t, uint64(1<<40), binary.BigEndian.Uint64(list[24:]))
	require.Equal(t, uint32(3), binary.BigEndian.Uint32(list[32:]))

	require.Equal(t, "WRITE(16) of 8 blocks at LBA 4660", cdbName(cdbBlocks(scsiWrite16, 0, 0x1234, 8)))
	require.Equal(t, "INQUIRY of VPD page 0xb2", cdbName(cdbInquiry(0xb2, true, 64)))
	require.Equal(t, "INQUIRY", cdbName(cdbInquiry(0, false, 96)))
	require.Equal(t, "REPORT LUNS", cdbName([]byte{0xa0}))
	require.Equal(t, "SCSI command 0xa3", cdbName([]byte{0xa3}))
}

func TestParseCapacity(t *testing.T) {
	rc := func(last uint64, bs uint32, b14 byte) []byte {
		b := make([]byte, 32)
		binary.BigEndian.PutUint64(b, last)
		binary.BigEndian.PutUint32(b[8:], bs)
		b[14] = b14
		return b
	}
	var li lunInfo
	require.NoError(t, li.parseCapacity(rc(8191, 512, 0xc0)))
	require.Equal(t, lunInfo{blockSize: 512, blocks: 8192, lbprz: true}, li)
	for _, c := range []struct {
		rc  []byte
		err string
	}{
		{rc(10, 520, 0), "logical block size 520 is not a power of two"},
		{rc(10, 256, 0), "logical block size 256"},
		{rc(10, 1<<17, 0), "logical block size 131072"},
		{rc(1<<62, 4096, 0), "do not fit in a 63-bit size"},
	} {
		require.ErrorContains(t, (&lunInfo{}).parseCapacity(c.rc), c.err)
	}
}

func TestParseVPD(t *testing.T) {
	bl := make([]byte, 64)
	binary.BigEndian.PutUint32(bl[8:], 2048)
	binary.BigEndian.PutUint32(bl[20:], 1<<20)
	binary.BigEndian.PutUint32(bl[24:], 16)
	binary.BigEndian.PutUint64(bl[36:], 1<<16)
	var li lunInfo
	li.parseBlockLimits(bl)
	require.Equal(t, lunInfo{maxTransfer: 2048, maxUnmapBlocks: 1 << 20, maxUnmapDescs: 16, maxWriteSame: 1 << 16}, li)
	li = lunInfo{}
	li.parseBlockLimits(bl[:20]) // a short (SBC-2) page: the unmap fields are absent
	require.Equal(t, lunInfo{maxTransfer: 2048}, li)

	li = lunInfo{}
	li.parseProvisioning([]byte{0, 0xb2, 0, 4, 0, 0xe4, 0, 0}) // tgtd's thin LUN
	require.Equal(t, lunInfo{lbpu: true, lbpws: true, lbprz: true}, li)
	li = lunInfo{}
	li.parseProvisioning([]byte{0, 0xb2, 0, 4, 0, 0x48, 0, 0}) // LBPRZ 2: a pattern, not zeroes
	require.Equal(t, lunInfo{lbpws: true}, li)
	li.parseProvisioning([]byte{0, 0xb2, 0}) // cut short: nothing learnt
	require.Equal(t, lunInfo{lbpws: true}, li)
}

func TestParseReportLUNs(t *testing.T) {
	answer := func(listLen uint32, entries ...[]byte) []byte {
		b := binary.BigEndian.AppendUint32(nil, listLen)
		b = append(b, 0, 0, 0, 0)
		for _, e := range entries {
			b = append(b, append(e, make([]byte, 8-len(e))...)...)
		}
		return b
	}
	for _, c := range []struct {
		name string
		data []byte
		want []uint64
	}{
		{"none", answer(0), nil},
		{"peripheral", answer(16, []byte{0, 0}, []byte{0, 1}), []uint64{0, 1}},
		{"flat space", answer(8, []byte{0x41, 0x2c}), []uint64{300}},
		{"another bus, logical unit addressing: left out", answer(16, []byte{0x01, 5}, []byte{0x80, 1}), nil},
		{"list longer than sent", answer(800, []byte{0, 2}, []byte{0, 3}), []uint64{2, 3}},
		{"list shorter than sent", answer(8, []byte{0, 2}, []byte{0, 3}), []uint64{2}},
		{"partial entry", answer(16, []byte{0, 2})[:12], nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			require.Equal(t, c.want, parseReportLUNs(c.data))
		})
	}
}
