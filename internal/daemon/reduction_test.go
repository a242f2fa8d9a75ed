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

// The export's reduction reaches its SSD tier: compress by default, where a block of zeros is
// stored as a bit (logical, not physical) and a block of data compressed; zero, where the data
// block is stored whole; off, where both are.
func TestOpenCacheReduction(t *testing.T) {
	for _, tc := range []struct {
		reduction, want string
		physical        uint64 // at most
	}{{"", "compress", 256}, {"compress", "compress", 256}, {"zero", "zero", 4096}, {"off", "off", 8192}} {
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
			require.LessOrEqual(t, ssd.PhysicalBytes, tc.physical)
			require.Positive(t, ssd.PhysicalBytes)
		})
	}
}

// An SSD tier made with reduction zero (the slot layout) keeps it when the config names no
// reduction, though the default is compress; named, compress is refused on it.
func TestOpenCacheDefaultKeepsLayout(t *testing.T) {
	dir := t.TempDir()
	e := config.Export{Name: "disk", Backend: "file://" + filepath.Join(dir, "disk.img") + "?size=1MiB", Cache: &config.Cache{
		Line: "4KiB", SSD: filepath.Join(dir, "ssd.img"), SSDSize: "256KiB", Admission: "always", Reduction: "zero"}}
	reg := registry.Default()
	b, err := reg.Open(e.Backend, backend.Options{})
	require.NoError(t, err)
	defer b.Close()
	open := func(reduction string) (string, error) {
		e.Cache.Reduction = reduction
		c, err := openCache(e, b, reg, filepath.Join(dir, "run"), slog.New(slog.DiscardHandler))
		if err != nil {
			return "", err
		}
		defer c.Close()
		return c.Stats().Tiers[0].Reduction, nil
	}
	got, err := open("zero")
	require.NoError(t, err)
	require.Equal(t, "zero", got)
	got, err = open("")
	require.NoError(t, err)
	require.Equal(t, "zero", got, "the default keeps the tier's layout")
	_, err = open("compress")
	require.ErrorContains(t, err, "SSD tier layout slots")
}
