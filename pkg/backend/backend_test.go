package backend_test

import (
	"errors"
	"fmt"
	"io"
	"math"
	"net/url"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/pkg/backend"
	"github.com/tierblk/tierblk/pkg/backend/fault"
	"github.com/tierblk/tierblk/pkg/backend/file"
	"github.com/tierblk/tierblk/pkg/backend/mem"
)

func TestCheckRange(t *testing.T) {
	const size = 1 << 20
	cases := []struct {
		name        string
		off, length int64
		ok          bool
	}{
		{"whole device", 0, size, true},
		{"empty at start", 0, 0, true},
		{"empty at the end", size, 0, true},
		{"last byte", size - 1, 1, true},
		{"middle", 4096, 8192, true},
		{"one past the end", size - 1, 2, false},
		{"starts at the end", size, 1, false},
		{"empty past the end", size + 1, 0, false},
		{"negative offset", -1, 1, false},
		{"negative length", 0, -1, false},
		{"longer than the device", 0, size + 1, false},
		{"offset+length overflows", math.MaxInt64, 1, false},
		{"huge length", 1, math.MaxInt64, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := backend.CheckRange(c.off, c.length, size)
			if c.ok {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, backend.ErrOutOfRange)
			require.ErrorContains(t, err, fmt.Sprintf("offset %d length %d size %d", c.off, c.length, size))
		})
	}
}

func TestIsRetryable(t *testing.T) {
	cases := []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"out of range", backend.ErrOutOfRange, false},
		{"read-only", backend.ErrReadOnly, false},
		{"not supported", backend.ErrNotSupported, false},
		{"closed", backend.ErrClosed, false},
		{"wrapped permanent", fmt.Errorf("disk.img: %w", backend.ErrReadOnly), false},
		{"joined with a permanent", errors.Join(io.EOF, backend.ErrClosed), false},
		{"I/O error", errors.New("input/output error"), true},
		{"dropped connection", fmt.Errorf("nbd: %w", io.ErrUnexpectedEOF), true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			require.Equal(t, c.want, backend.IsRetryable(c.err))
		})
	}
}

func newRegistry() *backend.Registry {
	r := backend.NewRegistry()
	r.Register("mem", "mem://SIZE", mem.Open)
	r.Register("file", "file:///path", file.Open)
	return r
}

func TestRegistryOpens(t *testing.T) {
	r := newRegistry()
	require.Equal(t, []string{"file", "mem"}, r.Schemes())
	require.Equal(t, []string{"file:///path", "mem://SIZE"}, r.Usage())

	b, err := r.Open("mem://64MiB", backend.Options{})
	require.NoError(t, err)
	require.Equal(t, int64(64<<20), b.Size())
	require.NoError(t, b.Close())

	path := filepath.Join(t.TempDir(), "disk.img")
	b, err = r.Open((&url.URL{Scheme: "file", Path: path, RawQuery: "size=1MiB"}).String(), backend.Options{})
	require.NoError(t, err)
	require.Equal(t, int64(1<<20), b.Size())
	_, err = b.WriteAt([]byte("x"), 0)
	require.NoError(t, err)
	require.NoError(t, b.Close())

	b, err = r.Open("file://"+path, backend.Options{ReadOnly: true})
	require.NoError(t, err)
	_, err = b.WriteAt([]byte("x"), 0)
	require.ErrorIs(t, err, backend.ErrReadOnly, "Options reach the factory")
	require.NoError(t, b.Close())
}

func TestRegistryErrors(t *testing.T) {
	r := newRegistry()
	cases := []struct {
		url     string
		wantErr string
	}{
		{"tape:///dev/st0", `unknown scheme "tape"; use one of: file:///path, mem://SIZE`},
		{"/srv/disk.img", `unknown scheme ""`},
		{"mem://%zz", `backend URL "mem://%zz"`},
		{"mem://user:secret@%zz", `backend URL "mem://user:xxxxx@%zz"`},
		{"mem://1Gx", "backend mem://1Gx: mem backend: size"},
		{"file:///nonexistent-dir/x.img", "backend file:///nonexistent-dir/x.img: /nonexistent-dir/x.img does not exist"},
	}
	for _, c := range cases {
		t.Run(c.url, func(t *testing.T) {
			b, err := r.Open(c.url, backend.Options{})
			require.ErrorContains(t, err, c.wantErr)
			require.Nil(t, b)
		})
	}
}

// A scheme with a parser of its own gets the raw URL through it, and a URL that fails to parse is
// a mistake in the URL (a usage error) whose message hides the password.
func TestRegistryParser(t *testing.T) {
	r := newRegistry()
	r.Register("odd", "odd://USER%PASSWORD@SIZE", func(u *url.URL, opts backend.Options) (backend.Backend, error) {
		return mem.Open(&url.URL{Scheme: "mem", Host: u.Host}, opts)
	})
	var got string
	r.RegisterParser("odd", func(raw string) (*url.URL, error) {
		got = raw
		if strings.Contains(raw, "bad") {
			return nil, errors.New("parser says no")
		}
		return &url.URL{Scheme: "odd", Host: "1MiB"}, nil
	})
	b, err := r.Open("odd://u%p@1MiB", backend.Options{})
	require.NoError(t, err)
	require.Equal(t, "odd://u%p@1MiB", got)
	require.Equal(t, int64(1<<20), b.Size())
	require.NoError(t, b.Close())

	_, err = r.Open("odd://u%secret@bad", backend.Options{})
	require.ErrorIs(t, err, backend.ErrBadURL)
	require.ErrorContains(t, err, `backend URL "odd://u:xxxxx@bad": parser says no`)
	require.NotContains(t, err.Error(), "secret")

	require.PanicsWithValue(t, "backend: parser for an unregistered scheme: tape", func() {
		r.RegisterParser("tape", url.Parse)
	})
}

func TestRedact(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"iscsi://nas/iqn.2001-04.com.example:disk/1", "iscsi://nas/iqn.2001-04.com.example:disk/1"},
		{"iscsi://alice@nas/iqn.x:y/1", "iscsi://alice@nas/iqn.x:y/1"},
		{"iscsi://alice%s3cret@nas:3261/iqn.x:y/1", "iscsi://alice:xxxxx@nas:3261/iqn.x:y/1"},
		{"iscsi://alice:s3cret@nas/iqn.x:y/1?header_digest=crc32c", "iscsi://alice:xxxxx@nas/iqn.x:y/1?header_digest=crc32c"},
		{"iscsi://alice:p@ss@nas/x", "iscsi://alice:xxxxx@nas/x"},
		{"iscsi://:only@nas/x", "iscsi://:xxxxx@nas/x"},
		{"nbd://nas/export@x", "nbd://nas/export@x"},
		{"file:///srv/a:b@c.img", "file:///srv/a:b@c.img"},
		{"mem://1GiB", "mem://1GiB"},
		{"not a url", "not a url"},
	} {
		require.Equal(t, c.want, backend.Redact(c.in), c.in)
	}
}

func TestRegistryDuplicatePanics(t *testing.T) {
	r := newRegistry()
	require.PanicsWithValue(t, "backend: scheme registered twice: mem", func() {
		r.Register("mem", "mem://SIZE", mem.Open)
	})
}

// plain hides every optional interface of the backend it wraps.
type plain struct{ backend.Backend }

func TestWriteFUA(t *testing.T) {
	cases := []struct {
		name       string
		hideFUA    bool
		failFlush  bool
		wantN      int
		wantErr    bool
		wantWrites int64 // WriteAt and WriteAtFUA calls, both counted as writes
		wantFlush  int64
	}{
		{name: "its own FUA write", wantN: 8, wantWrites: 1},
		{name: "write and flush", hideFUA: true, wantN: 8, wantWrites: 1, wantFlush: 1},
		{name: "flush fails", hideFUA: true, failFlush: true, wantN: 0, wantErr: true, wantWrites: 1, wantFlush: 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := fault.New(mem.New(1<<20), fault.Options{Seed: 1})
			if tc.failFlush {
				f.AddRule(fault.Rule{Op: fault.Flush, Nth: 1})
			}
			var b backend.Backend = f
			if tc.hideFUA {
				b = plain{f}
			}
			n, err := backend.WriteFUA(b, []byte("durable!"), 4096)
			require.Equal(t, tc.wantN, n)
			require.Equal(t, tc.wantErr, err != nil, "err: %v", err)
			got := f.Counts()
			require.Equal(t, tc.wantWrites, got[fault.Write])
			require.Equal(t, tc.wantFlush, got[fault.Flush], "a backend with its own FUA write needs no flush")
			if err == nil {
				back := make([]byte, 8)
				_, err := f.ReadAt(back, 4096)
				require.NoError(t, err)
				require.Equal(t, "durable!", string(back))
			}
		})
	}
}
