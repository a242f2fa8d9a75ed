package csi

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"gopkg.in/yaml.v3"

	"github.com/tierblk/tierblk/internal/config"
)

// The files of a staged volume's record, in StateDir/volumes/DIR/.
const (
	// recordConfig is the volume's daemon configuration, as `tierblk serve --config` reads it:
	// a user can see (and, the plugin stopped, run) what serves the volume.
	recordConfig = "tierblk.yaml"
	// recordFacts is what CSI said when staging it. Written last: a directory without it was
	// being recorded when the plugin died, before any device existed.
	recordFacts = "volume.json"
)

// record is what the node plugin knows of a volume it staged, kept in the state directory so
// that a restarted plugin serves it again.
type record struct {
	VolumeID    string `json:"volume_id"`
	StagingPath string `json:"staging_path"`
	// Block is true for a raw block volume, false for a mounted file system.
	Block      bool     `json:"block"`
	FsType     string   `json:"fs_type,omitempty"`
	MountFlags []string `json:"mount_flags,omitempty"`
	// ReadOnly is the access mode SINGLE_NODE_READER_ONLY: the file system is mounted read-only.
	ReadOnly bool `json:"read_only"`
	// Device is the kernel device serving the volume: /dev/ublkbN or /dev/nbdN.
	Device string `json:"device"`
	PVName string `json:"pv_name,omitempty"`

	// cfg is the daemon's configuration (recordConfig), not part of the JSON.
	cfg config.Config
}

// sameStage reports whether a NodeStage asking for r is answered by o, already staged: same
// path and same capability (CSI: then the call is idempotent, else ALREADY_EXISTS).
func (r record) sameStage(o record) bool {
	return r.VolumeID == o.VolumeID && r.StagingPath == o.StagingPath && r.Block == o.Block &&
		fsTypeOf(r.FsType) == fsTypeOf(o.FsType) && slices.Equal(r.MountFlags, o.MountFlags) && r.ReadOnly == o.ReadOnly
}

// fsTypeOf is the file system made for fs_type fs: "" is ext4.
func fsTypeOf(fs string) string {
	if fs == "" {
		return "ext4"
	}
	return fs
}

// writeRecord writes r into dir, each file atomically (a temporary file renamed over it, then
// the directory synced), the configuration first: volume.json present means the record is whole.
func writeRecord(dir string, r record) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	y, err := yaml.Marshal(r.cfg)
	if err != nil {
		return err
	}
	j, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := writeAtomic(dir, recordConfig, y); err != nil {
		return err
	}
	return writeAtomic(dir, recordFacts, append(j, '\n'))
}

// writeAtomic replaces dir/name with data, durably: a crash leaves the old file or the new one.
func writeAtomic(dir, name string, data []byte) error {
	f, err := os.CreateTemp(dir, name+".tmp*")
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), filepath.Join(dir, name))
	}
	if err != nil {
		os.Remove(f.Name())
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// errIncomplete is readRecord's answer for a directory whose recording was cut short.
var errIncomplete = errors.New("incomplete record")

// readRecord reads the record in dir; schemes are the backend schemes its configuration may use.
func readRecord(dir string, schemes []string) (record, error) {
	var r record
	j, err := os.ReadFile(filepath.Join(dir, recordFacts))
	if errors.Is(err, os.ErrNotExist) {
		return r, errIncomplete
	}
	if err != nil {
		return r, err
	}
	if err := json.Unmarshal(j, &r); err != nil {
		return r, fmt.Errorf("%s: %w", filepath.Join(dir, recordFacts), err)
	}
	if r.cfg, err = config.Load(filepath.Join(dir, recordConfig)); err != nil {
		return r, err
	}
	if err := r.cfg.Validate(schemes); err != nil {
		return r, fmt.Errorf("%s: %w", filepath.Join(dir, recordConfig), err)
	}
	return r, nil
}
