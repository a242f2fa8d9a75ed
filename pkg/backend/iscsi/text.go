package iscsi

import (
	"bytes"
	"fmt"
)

// Text keys (RFC 7143 section 6): the data segment of Login and Text PDUs is a list of
// key=value pairs, each ended by a NUL.

// maxTextLen bounds the text of one login stage that we accept across PDUs: the keys we know
// and a few unknown ones fit many times over, a target that sends more is broken or hostile.
const maxTextLen = 64 << 10

// pair is one key=value.
type pair struct{ key, value string }

// parseText splits a data segment into its pairs. A NUL-free tail (a segment cut short), a pair
// without '=', an empty key or a key given twice is an error.
func parseText(data []byte) ([]pair, error) {
	var ps []pair
	seen := map[string]bool{}
	for len(data) > 0 {
		end := bytes.IndexByte(data, 0)
		if end < 0 {
			return nil, fmt.Errorf("%w: text %q does not end with a NUL", ErrProtocol, truncate(data))
		}
		kv := data[:end]
		data = data[end+1:]
		if len(kv) == 0 {
			continue // some targets pad with NULs
		}
		k, v, ok := bytes.Cut(kv, []byte("="))
		if !ok || len(k) == 0 {
			return nil, fmt.Errorf("%w: text %q is not key=value", ErrProtocol, truncate(kv))
		}
		if seen[string(k)] {
			return nil, fmt.Errorf("%w: text key %s given twice", ErrProtocol, truncate(k))
		}
		seen[string(k)] = true
		ps = append(ps, pair{string(k), string(v)})
	}
	return ps, nil
}

// truncate shortens what a peer sent for an error message.
func truncate(b []byte) string {
	const limit = 64
	if len(b) > limit {
		return string(b[:limit]) + "..."
	}
	return string(b)
}

// appendText appends the pairs in wire form.
func appendText(dst []byte, ps ...pair) []byte {
	for _, p := range ps {
		dst = append(dst, p.key...)
		dst = append(dst, '=')
		dst = append(dst, p.value...)
		dst = append(dst, 0)
	}
	return dst
}
