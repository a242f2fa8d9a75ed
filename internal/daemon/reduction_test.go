package daemon

import (
	"log/slog"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/config"
	"github.com/tierblk/tierblk/pkg/backend"
	"github.com/tierblk/tierblk/pkg/backend/registry"
)

// The export's reduction reaches its SSD tier: zero by default, where a block of zeros is stored
// as a bit (logical, not physical), and off where it is written.
func TestOpenCacheReduction(t *testing.T) {
	for _, tc := range []struct {
		reduction, want string
		physical        uint64
	}{{"", "zero", 4096}, {"zero", "zero", 4096}, {"off", "off", 8192}} {
		t.Run("reduction "+tc.reduction, func(t *testing.T) {
			dir := t.TempDir()
			e := config.Export{Name: "disk", Backend: "file://" + filepath.Join(dir, "disk.img") + "?size=1MiB", Cache: &config.Cache{
				Line: "4KiB", SSD: filepath.Join(dir, "ssd.img"), SSDSize: "256KiB", Admission: "always", Reduction: tc.reduction}}
			reg := registry.Default()
			b, err := reg.Open(e.Backend, backend.Options{})
			require.NoError(t, err)
			c, err := openCache(e, b, reg, filepath.Join(dir, "run"), slog.New(slog.DiscardHandler))
			require.NoError(t, err)
			defer c.Close()
			data := make([]byte, 8192) // a block of data, then a block of zeros
			data[0] = 1
			_, err = c.WriteAt(data, 0)
			require.NoError(t, err)
			ssd := c.Stats().Tiers[0]
			require.Equal(t, tc.want, ssd.Reduction)
			require.Equal(t, uint64(8192), ssd.LogicalBytes)
			require.Equal(t, tc.physical, ssd.PhysicalBytes)
		})
	}
}
