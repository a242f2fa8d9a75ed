package mem

import (
	"math/rand/v2"
	"net/url"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/units"
	"github.com/tierblk/tierblk/pkg/backend"
	"github.com/tierblk/tierblk/pkg/backend/backendtest"
)

func TestConformance(t *testing.T) {
	backendtest.Run(t, func(t *testing.T, size int64) backend.Backend {
		b, err := Open(&url.URL{Scheme: "mem", Host: units.FormatSize(size)}, backend.Options{})
		require.NoError(t, err)
		return b
	})
}

func TestParseURL(t *testing.T) {
	cases := []struct {
		url     string
		size    int64
		wantErr string
	}{
		{"mem://1GiB", 1 << 30, ""},
		{"mem://64MiB", 64 << 20, ""},
		{"mem://1TiB", 1 << 40, ""},
		{"mem://4096", 4096, ""},
		{"mem://1GiB/", 1 << 30, ""},
		{"mem:///?size=1GiB", 1 << 30, ""},
		{"mem://?size=2MiB", 2 << 20, ""},
		{"mem://", 0, "no size"},
		{"mem:///", 0, "no size"},
		{"mem://0", 0, "between 1 byte and 1024TiB"},
		{"mem://2PiB", 0, "not a number"},
		{"mem://2048TiB", 0, "between 1 byte and 1024TiB"},
		{"mem://1Gx", 0, "not a number"},
		{"mem://1GiB?size=1GiB", 0, "both as host"},
		{"mem:///?size=1GiB&size=2GiB", 0, "given 2 times"},
		{"mem://1GiB?sise=1&zz=2", 0, "unknown parameter sise, zz; valid: size"},
		{"mem://1GiB/disk", 0, "malformed"},
		{"mem:1GiB", 0, "malformed"},
		{"mem://user@1GiB", 0, "malformed"},
		{"file:///x", 0, "not mem"},
	}
	for _, c := range cases {
		t.Run(c.url, func(t *testing.T) {
			u, err := url.Parse(c.url)
			require.NoError(t, err)
			b, err := Open(u, backend.Options{})
			if c.wantErr != "" {
				require.ErrorContains(t, err, c.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, c.size, b.Size())
			require.NoError(t, b.Close())
		})
	}
}

func TestSparse(t *testing.T) {
	m := New(1 << 40) // 1 TiB costs a 32 KiB table until written
	require.Zero(t, m.Allocated())
	buf := make([]byte, 4096)
	_, err := m.ReadAt(buf, 1<<39)
	require.NoError(t, err)
	require.Zero(t, m.Allocated(), "a read allocates nothing")

	buf[0] = 1
	_, err = m.WriteAt(buf, 1<<39+pageSize-1) // straddles two pages
	require.NoError(t, err)
	require.Equal(t, int64(2*pageSize), m.Allocated())

	require.NoError(t, m.WriteZeroes(0, 1<<40, false))
	require.Equal(t, int64(2*pageSize), m.Allocated(), "zeroing without unmap keeps written pages, allocates no others")
	require.NoError(t, m.Trim(0, 1<<40))
	require.Zero(t, m.Allocated(), "trim of the whole device frees everything")

	_, err = m.WriteAt(buf, 0)
	require.NoError(t, err)
	_, err = m.WriteAt(buf, pageSize)
	require.NoError(t, err)
	require.NoError(t, m.WriteZeroes(0, 2*pageSize, false))
	require.Equal(t, int64(2*pageSize), m.Allocated(), "zeroing without unmap keeps pages")
	require.NoError(t, m.Trim(10, pageSize))
	require.Equal(t, int64(2*pageSize), m.Allocated(), "partial pages stay allocated")
	require.NoError(t, m.Trim(0, 2*pageSize))
	require.Zero(t, m.Allocated())
}

func TestOddSize(t *testing.T) {
	m := New(pageSize + 7)
	p := []byte("0123456789")
	_, err := m.WriteAt(p, pageSize-3)
	require.NoError(t, err)
	got := make([]byte, 10)
	_, err = m.ReadAt(got, pageSize-3)
	require.NoError(t, err)
	require.Equal(t, p, got)
	_, err = m.WriteAt(p, pageSize-2)
	require.ErrorIs(t, err, backend.ErrOutOfRange)
	require.NoError(t, m.Trim(0, pageSize+7))
	_, err = m.ReadAt(got, pageSize-3)
	require.NoError(t, err)
	require.Equal(t, make([]byte, 10), got)
}

func TestReadOnly(t *testing.T) {
	u, err := url.Parse("mem://1MiB")
	require.NoError(t, err)
	b, err := Open(u, backend.Options{ReadOnly: true})
	require.NoError(t, err)
	require.True(t, b.(backend.ReadOnlyReporter).ReadOnly())
	_, err = b.WriteAt([]byte{1}, 0)
	require.ErrorIs(t, err, backend.ErrReadOnly)
	require.ErrorIs(t, b.(backend.Trimmer).Trim(0, 1), backend.ErrReadOnly)
	require.ErrorIs(t, b.(backend.ZeroWriter).WriteZeroes(0, 1, false), backend.ErrReadOnly)
	got := []byte{9}
	_, err = b.ReadAt(got, 0)
	require.NoError(t, err)
	require.Equal(t, []byte{0}, got)
}

func TestNewPanicsOnBadSize(t *testing.T) {
	require.Panics(t, func() { New(0) })
	require.Panics(t, func() { New(MaxSize + 1) })
}

// BenchmarkRandom4K is the access pattern of the nbdkit memory comparison: 4 KiB random reads and
// writes from many goroutines over 1 GiB, once every page is allocated.
func BenchmarkRandom4K(b *testing.B) {
	const size = 1 << 30
	m := New(size)
	chunk := make([]byte, 1<<20)
	for off := int64(0); off < size; off += int64(len(chunk)) {
		if _, err := m.WriteAt(chunk, off); err != nil {
			b.Fatal(err)
		}
	}
	for _, write := range []bool{false, true} {
		b.Run(map[bool]string{false: "read", true: "write"}[write], func(b *testing.B) {
			b.SetBytes(4096)
			b.SetParallelism(32)
			b.RunParallel(func(pb *testing.PB) {
				r := rand.New(rand.NewPCG(rand.Uint64(), 0))
				buf := make([]byte, 4096)
				for pb.Next() {
					off := r.Int64N(size/4096) * 4096
					var err error
					if write {
						_, err = m.WriteAt(buf, off)
					} else {
						_, err = m.ReadAt(buf, off)
					}
					if err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
