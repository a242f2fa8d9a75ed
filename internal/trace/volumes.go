package trace

import "bytes"

// volumes numbers the volumes of a multi-volume trace in the order the trace first names them
// (0, 1, 2 ...), so numbers are stable for a given file and cost one map lookup per new name.
type volumes struct {
	ids   map[string]uint32
	names []string
	// rename turns a key as the trace spells it into the name users see (nil: the key itself).
	rename func(key string) string
	// last caches the previous key: consecutive requests usually hit the same volume.
	last   []byte
	lastID uint32
	seen   bool
}

func newVolumes(rename func(string) string) *volumes {
	return &volumes{ids: map[string]uint32{}, rename: rename}
}

func (v *volumes) id(key []byte) uint32 {
	if v.seen && bytes.Equal(key, v.last) {
		return v.lastID
	}
	id, ok := v.ids[string(key)]
	if !ok {
		id = uint32(len(v.names))
		k := string(key)
		v.ids[k] = id
		if v.rename != nil {
			k = v.rename(k)
		}
		v.names = append(v.names, k)
	}
	v.last = append(v.last[:0], key...)
	v.lastID, v.seen = id, true
	return id
}

// name returns the volume's name, or "" for a number the trace never gave.
func (v *volumes) name(id uint32) string {
	if int(id) < len(v.names) {
		return v.names[id]
	}
	return ""
}
