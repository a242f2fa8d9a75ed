package csi

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/tierblk/tierblk/internal/config"
)

// The keys of a volume's settings: a StorageClass's parameters (checked by CreateVolume, which
// passes them on in the volume context), or a static PV's volume attributes. NodeStage reads
// them from the volume context.
const (
	// keyBackend is a static volume's backend URL (file://, nbd://, iscsi://...); a dynamic
	// volume's is its file in the backing directory.
	keyBackend = "backend"
	// keyMode is the cache's mode (config.Cache.Mode); writeback by default.
	keyMode = "mode"
	// keyRAM is the size of the volume's RAM tier on the node (64MiB by default, 0 for none).
	keyRAM = "ram"
	// keySSDSize is the size of the volume's SSD tier in the node's cache directory (1GiB by default).
	keySSDSize = "ssdSize"
	// keyLine is the cache's line (config.Cache.Line).
	keyLine = "line"
	// keyPVName is the name of the volume's PV, the label of its metrics: CreateVolume takes it
	// from the external-provisioner's csi.storage.k8s.io/pv/name (--extra-create-metadata); a
	// static PV may give it.
	keyPVName = "pvName"
	// paramPVName is what the external-provisioner passes with --extra-create-metadata.
	paramPVName = "csi.storage.k8s.io/pv/name"
	// metadataPrefix starts the parameters the external-provisioner adds.
	metadataPrefix = "csi.storage.k8s.io/"
)

var settingKeys = []string{keyBackend, keyMode, keyRAM, keySSDSize, keyLine, keyPVName}

// Defaults of a volume's cache.
const (
	defaultMode    = "writeback"
	defaultRAM     = "64MiB"
	defaultSSDSize = "1GiB"
)

// settings are a volume's settings, checked.
type settings map[string]string

// parseSettings checks attrs (a StorageClass's parameters or a volume context): every key known,
// every value valid for the setting it sets. Parameters the external-provisioner adds
// (csi.storage.k8s.io/...) are dropped, but for the PV's name.
func parseSettings(attrs map[string]string) (settings, error) {
	s := settings{}
	for k, v := range attrs {
		switch {
		case k == paramPVName:
			s[keyPVName] = v
		case strings.HasPrefix(k, metadataPrefix):
		case slices.Contains(settingKeys, k):
			s[k] = v
		default:
			return nil, fmt.Errorf("unknown parameter %q: tierblk's are %s", k, strings.Join(settingKeys, ", "))
		}
	}
	// The cache's settings are checked as a tierblk config would be, in front of a file.
	cfg := config.Defaults()
	cfg.Exports = []config.Export{s.export("check", "file:///dev/null", "/nonexistent")}
	cfg.Listen = []string{"unix:/nonexistent.sock"}
	if err := cfg.Validate([]string{"file"}); err != nil {
		return nil, fmt.Errorf("parameters: %s", paramNames(err.Error()))
	}
	return s, nil
}

// paramNames puts the names of the parameters in place of the config fields they set.
func paramNames(msg string) string {
	return strings.NewReplacer("exports[0].cache.mode", keyMode, "exports[0].cache.ram", keyRAM,
		"exports[0].cache.ssd_size", keySSDSize, "exports[0].cache.line", keyLine).Replace(msg)
}

func (s settings) get(key, def string) string {
	if v, ok := s[key]; ok {
		return v
	}
	return def
}

// export is the tierblk export of a volume named name, with the given backend and its SSD tier
// in ssdDir (ssdDir/ssd.img, metadata in ssdDir/ssd.img.meta); the caller adds the kernel device.
func (s settings) export(name, backendURL, ssdDir string) config.Export {
	return config.Export{
		Name:    name,
		Backend: backendURL,
		Cache: &config.Cache{
			Mode:    s.get(keyMode, defaultMode),
			Line:    s[keyLine],
			RAM:     s.get(keyRAM, defaultRAM),
			SSD:     filepath.Join(ssdDir, "ssd.img"),
			SSDSize: s.get(keySSDSize, defaultSSDSize),
		},
	}
}

// safeID matches a volume name that can be its ID and its file's name as it is.
var safeID = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$`)

// volumeID is the ID of the volume CreateVolume was asked to call name: the name itself when it
// is safe as a file name, else a hash of it. The same name always gives the same ID, which
// makes CreateVolume idempotent.
func volumeID(name string) string {
	if safeID.MatchString(name) {
		return name
	}
	h := sha256.Sum256([]byte(name))
	return "vol-" + hex.EncodeToString(h[:16])
}

// validID reports whether id can name a file or directory of this driver's (it came from
// volumeID, or names a static volume): no path separators, no dot-dot.
func validID(id string) bool { return safeID.MatchString(id) && !strings.Contains(id, "..") }
