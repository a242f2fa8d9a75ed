package uring

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/abitest"
	"github.com/tierblk/tierblk/internal/testenv"
)

// testRing sets up a ring, or skips the test where the host kernel forbids io_uring.
func testRing(t *testing.T, entries, flags uint32) *Ring {
	t.Helper()
	r, err := New(entries, flags)
	if Unavailable(err) {
		testenv.Skip(t, testenv.IOUring, err.Error())
	}
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, r.Close()) })
	return r
}

// The layouts of include/uapi/linux/io_uring.h: each field's offset and each struct's size, as the
// C compiler lays them out on amd64.
func TestStructLayouts(t *testing.T) {
	abitest.Check(t, []abitest.Struct{
		abitest.Of("io_uring_sqe", SQE{}, 64, 0, 1, 2, 4, 8, 16, 24, 28, 32, 40, 42, 44, 48, 56),
		abitest.Of("io_uring_cqe", CQE{}, 16, 0, 8, 12),
		abitest.Of("io_sqring_offsets", SQRingOffsets{}, 40, 0, 4, 8, 12, 16, 20, 24, 28, 32),
		abitest.Of("io_cqring_offsets", CQRingOffsets{}, 40, 0, 4, 8, 12, 16, 20, 24, 28, 32),
		abitest.Of("io_uring_params", Params{}, 120, 0, 4, 8, 12, 16, 20, 24, 28, 40, 80),
	})
	require.Equal(t, SQECmdOffset, int(unsafe.Offsetof(SQE{}.Addr3)))
}

func TestRingNop(t *testing.T) {
	for _, tc := range []struct {
		name  string
		flags uint32
	}{
		{"64-byte SQEs", 0},
		{"128-byte SQEs", SetupSQE128},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := testRing(t, 4, tc.flags)
			// Several rounds, more than the ring holds, so that head and tail wrap around.
			for round := range 5 {
				for i := range 4 {
					s, cmd, err := r.Get()
					require.NoError(t, err)
					require.Len(t, cmd, r.sqeSize-SQECmdOffset)
					s.Opcode = OpNop
					s.UserData = uint64(round*10 + i)
				}
				_, _, err := r.Get()
				require.ErrorIs(t, err, ErrRingFull)
				require.NoError(t, r.Submit(4))
				var got []uint64
				r.Reap(func(e CQE) {
					require.Zero(t, e.Res)
					got = append(got, e.UserData)
				})
				want := []uint64{uint64(round * 10), uint64(round*10 + 1), uint64(round*10 + 2), uint64(round*10 + 3)}
				require.ElementsMatch(t, want, got)
				require.Zero(t, r.Ready())
			}
		})
	}
}
