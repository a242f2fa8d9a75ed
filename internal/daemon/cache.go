package daemon

import (
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/tierblk/tierblk/internal/cache"
	"github.com/tierblk/tierblk/internal/config"
	"github.com/tierblk/tierblk/internal/crc32c"
	"github.com/tierblk/tierblk/internal/meta"
	"github.com/tierblk/tierblk/internal/units"
	"github.com/tierblk/tierblk/pkg/backend"
)

// openCache puts the export's cache in front of b. The cache owns b from then on: closing the
// cache closes b, the SSD and the metadata. Its errors begin with the field of the export they are
// about ("cache.ssd: ", "cache: "), for the caller to put the export's path before.
// The SSD tier's run log goes in runDir.
func openCache(e config.Export, b backend.Backend, reg *backend.Registry, runDir string, log *slog.Logger) (*cache.Cache, error) {
	cc := e.Cache
	sizes, err := cc.Sizes()
	if err != nil {
		return nil, fmt.Errorf("cache: %w", err)
	}
	mode := cache.WriteThrough
	if cc.Mode != "" {
		if mode, err = cache.ParseMode(cc.Mode); err != nil {
			return nil, fmt.Errorf("cache: %w", err)
		}
	}
	congestion, err := cc.CongestionThreshold()
	if err != nil {
		return nil, fmt.Errorf("cache: %w", err)
	}
	reduction, err := cc.ReductionLevel()
	if err != nil {
		return nil, fmt.Errorf("cache: %w", err)
	}
	rp, ra, sp, sa := cc.TierPolicies()
	cfg := cache.Config{
		Congestion: congestion,
		LineSize:   sizes.Line,
		Mode:       mode,
		Reduction:  reduction,
		// A tier of the other layout keeps its own unless the config names a reduction.
		ReductionDefault: cc.Reduction == "",
		RAM:              cache.TierConfig{Size: sizes.RAM, Policy: rp, Admission: ra},
		SSD:              cache.TierConfig{Size: sizes.SSDSize, Policy: sp, Admission: sa},
		BackendID:        backend.Redact(e.Backend), // stored on the SSD tier: no password there
		WriteBack:        cc.WriteBack.Engine(),
		Log:              log.With("export", e.Name),
	}
	if cc.SSD != "" {
		dev, err := openSSD(reg, cc.SSD, sizes.SSDSize, log)
		if err != nil {
			return nil, fmt.Errorf("cache.ssd: %w", err)
		}
		if cfg.SSD.Size == 0 {
			cfg.SSD.Size = dev.Size() / sizes.Line * sizes.Line
		}
		dir := cc.MetaDir()
		if clean := filepath.Clean(dir); strings.HasPrefix(clean, "/dev/") && !strings.HasPrefix(clean, "/dev/shm/") {
			// The default next to a block device (/dev/sdb.meta) would land in devtmpfs and be lost
			// at boot. /dev/shm is an ordinary tmpfs, which a user may choose.
			dev.Close()
			return nil, &config.Error{Field: "cache.meta", Msg: fmt.Sprintf("%s is a block device's path; give a metadata directory on a file system", dir)}
		}
		store, err := meta.OpenBadger(dir, log)
		if err != nil {
			dev.Close()
			return nil, fmt.Errorf("cache.meta: %w", err)
		}
		cfg.SSDDevice, cfg.Meta = dev, store
		if err := prepareRunDir(runDir); err != nil {
			log.Warn("no run log: a kill of tierblk will lose the index records written since the last checkpoint; give --run-dir (run_dir) a directory on a tmpfs this user may write",
				"export", e.Name, "err", err)
		} else {
			cfg.RunLog = runLog(runDir, e)
		}
	}
	c, err := cache.New(b, cfg)
	switch {
	case errors.Is(err, cache.ErrMismatch):
		err = fmt.Errorf("cache: %w. Start with the settings it was made with, or delete %s to start with an empty SSD tier", err, cc.MetaDir())
	case errors.Is(err, cache.ErrCorrupt):
		err = fmt.Errorf("cache: %s: %w. Restore it from a backup, or delete it to start with an empty SSD tier (losing the data not yet written back)", cc.MetaDir(), err)
	case err != nil:
		err = fmt.Errorf("cache: %w", err)
	}
	if err != nil {
		if cfg.SSDDevice != nil {
			err = errors.Join(err, cfg.SSDDevice.Close(), cfg.Meta.Close())
		}
		return nil, err
	}
	log.Info("cache", "export", e.Name, "mode", mode, "line", units.FormatSize(sizes.Line),
		"ram", units.FormatSize(sizes.RAM), "ssd", cc.SSD, "ssd_size", units.FormatSize(cfg.SSD.Size),
		"meta", cc.MetaDir(), "checksums", "crc32c by "+crc32c.Impl())
	return c, nil
}

// ssdFilesSized refuses an SSD tier whose file does not exist and whose size is not given: nothing
// says how large to create it, so a setting is missing, as for a file:// backend without ?size=.
// Run checks it before it opens (perhaps creates) any backend; the error is a *config.Error.
func ssdFilesSized(cfg config.Config) error {
	for i, e := range cfg.Exports {
		if e.Cache == nil || e.Cache.SSD == "" {
			continue
		}
		if sizes, err := e.Cache.Sizes(); err != nil || sizes.SSDSize != 0 {
			continue // a size to create it at, or a bad one, which Validate has refused
		}
		if _, err := os.Stat(e.Cache.SSD); errors.Is(err, os.ErrNotExist) {
			return &config.Error{Field: fmt.Sprintf("exports[%d].cache.ssd", i), Msg: errSSDUnsized(e.Cache.SSD).Error()}
		}
	}
	return nil
}

func errSSDUnsized(path string) error {
	return fmt.Errorf("%s does not exist; give its size (--ssd-size, ssd_size) to create it", path)
}

// openSSD opens the SSD tier's file or device, creating a missing file at size. Reads bypass the
// page cache (O_DIRECT), which would only hold a second copy of what the RAM tier holds; writes go
// through it, so that a burst of small writes costs memory copies, not disk round trips: the
// journal flushes the SSD before it commits any record that finds the data, so durability is the
// same (bench writeback's 4K random write row; direct writes make it several times slower).
// A file system without O_DIRECT (tmpfs) gets buffered reads too, and a warning. It is opened as
// any backend is, through reg, as a file:// URL.
func openSSD(reg *backend.Registry, path string, size int64, log *slog.Logger) (backend.Backend, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	q := url.Values{}
	if _, err := os.Stat(abs); errors.Is(err, os.ErrNotExist) {
		if size == 0 { // gone since Run's ssdFilesSized
			return nil, errSSDUnsized(path)
		}
		q.Set("size", fmt.Sprint(size))
	}
	u := url.URL{Scheme: "file", Path: abs}
	q.Set("direct", "reads")
	q.Set("allocate", "true") // its blocks reserved now: a full file system fails the start, not a write
	u.RawQuery = q.Encode()
	opts := backend.Options{Logger: log}
	dev, err := reg.Open(u.String(), opts)
	if errors.Is(err, backend.ErrNoDirectIO) {
		log.Warn("the SSD tier's file system has no direct I/O; using buffered I/O", "ssd", path)
		q.Del("direct")
		u.RawQuery = q.Encode()
		dev, err = reg.Open(u.String(), opts)
	}
	if err != nil {
		if errno := syscall.Errno(0); errors.As(err, &errno) && (errno == syscall.EACCES || errno == syscall.EPERM || errno == syscall.EROFS) {
			// Not the file backend's advice to open it read-only: a tier is written.
			return nil, fmt.Errorf("%s cannot be opened for writing (%w); an SSD tier is written to: fix its permissions (the daemon runs as uid %d), or give --ssd (ssd) another path",
				path, errno, os.Geteuid())
		}
		// The user named a path, not the URL made of it: say what the file backend said.
		if inner := errors.Unwrap(err); inner != nil {
			err = inner
		}
		return nil, err
	}
	if ro, ok := dev.(backend.ReadOnlyReporter); ok && ro.ReadOnly() {
		dev.Close()
		return nil, fmt.Errorf("%s is read-only (blockdev --setrw %s makes a read-only block device writable); an SSD tier is written to", path, path)
	}
	return dev, nil
}
