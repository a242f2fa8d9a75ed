//go:build linux

package cli

import (
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/pkg/backend/registry"
)

// Serve's help lists every backend this binary has.
func TestServeHelpListsEveryBackend(t *testing.T) {
	long := newServeCmd().Long
	for _, scheme := range registry.Default().Schemes() {
		require.Contains(t, long, scheme+"://", "serve's help lists no %s:// backend", scheme)
	}
}

// The example admin addresses of every command's help are the ones the docs and configs use: the
// socket in the run directory, /run/tierblk/admin.sock, and port 9810.
func TestHelpAdminAddresses(t *testing.T) {
	addr := regexp.MustCompile(`--admin[ =](unix:\S+|\S+:\d+)`)
	var walk func(c *cobra.Command)
	found := 0
	walk = func(c *cobra.Command) {
		for _, m := range addr.FindAllStringSubmatch(c.Long+"\n"+c.Example, -1) {
			found++
			a := m[1]
			switch {
			case strings.HasPrefix(a, "unix:/run/"):
				require.Equal(t, "unix:/run/tierblk/admin.sock", a, "an example of %q", c.CommandPath())
			case !strings.HasPrefix(a, "unix:"):
				require.Equal(t, "127.0.0.1:9810", a, "an example of %q", c.CommandPath())
			}
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(NewRoot("test"))
	require.NotZero(t, found, "no example gives --admin")
}
