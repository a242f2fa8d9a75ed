package testenv

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// A capability is required only where TIERBLK_REQUIRE lists it.
func TestRequired(t *testing.T) {
	for _, tc := range []struct {
		env  string
		want map[string]bool
	}{
		{"", map[string]bool{DirectIO: false, IOUring: false}},
		{"io_uring", map[string]bool{DirectIO: false, IOUring: true}},
		{"direct-io,io_uring", map[string]bool{DirectIO: true, IOUring: true}},
		{"io_uring_x", map[string]bool{IOUring: false}},
	} {
		t.Setenv("TIERBLK_REQUIRE", tc.env)
		for c, want := range tc.want {
			require.Equal(t, want, required(c), "TIERBLK_REQUIRE=%q, %s", tc.env, c)
		}
	}
}
