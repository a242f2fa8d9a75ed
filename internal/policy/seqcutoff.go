package policy

import (
	"fmt"
	"math"

	"github.com/tierblk/tierblk/internal/units"
)

// SeqCutoff keeps long sequential streams out of the cache, as bcache's sequential_cutoff does
// (Kent Overstreet, bcache; Linux, Documentation/admin-guide/bcache.rst): a backup or a large file
// copy reads or writes each block once, and a disk streams it about as fast as an SSD would, so
// caching it would only push out the random I/O that the cache serves well.
//
// It remembers the seqStreams most recently used streams by the offset where each is expected to
// continue. A request that starts where a stream ended extends it; once a stream has covered more
// bytes than the cutoff, counting the request at hand, its requests are not admitted. A request
// that continues no stream starts a new one in the least recently used slot and is admitted: random
// I/O always is. Interleaved streams (several readers, or one reader with several files) are each
// tracked in their own slot.
//
// The cache asks once per missed key, with the whole request's offset and length, so one request
// may be asked about several times; a request that repeats the latest one of a stream gets that
// request's answer without extending the stream. Since only misses are asked about, a stream whose
// blocks partly hit may be seen with a gap and count again from zero; that errs towards caching.
//
// Spec: "seqcutoff" (4MiB, bcache's default) or "seqcutoff:SIZE", SIZE as units.ParseSize reads it
// ("4MiB", "512KiB", "1048576").
type SeqCutoff struct {
	cutoff int64
	// The streams, one slot per index, as parallel arrays so that the scan of every decision reads
	// a few cache lines: the latest request of stream i is [start[i], end[i]) (end[i] is where it
	// continues, -1 for a free slot), length[i] the bytes it has covered, admit[i] the answer for its
	// latest request, used[i] when it was last seen.
	start, end, length [seqStreams]int64
	used               [seqStreams]uint64
	admit              [seqStreams]bool
	clock              uint64
}

const (
	// seqStreams is how many streams are tracked at once: more than the concurrent sequential
	// readers and writers of a block device in practice, few enough to scan on every miss.
	seqStreams       = 32
	seqDefaultCutoff = 4 << 20
	seqForm          = "write seqcutoff:SIZE with SIZE above 0, such as seqcutoff:4MiB"
)

// NewSeqCutoff builds a SeqCutoff policy that bypasses streams longer than cutoff bytes.
func NewSeqCutoff(cutoff int64) (*SeqCutoff, error) {
	if cutoff <= 0 {
		return nil, fmt.Errorf("cutoff %d must be above 0; %s", cutoff, seqForm)
	}
	s := &SeqCutoff{cutoff: cutoff}
	for i := range s.end {
		s.end[i] = -1
	}
	return s, nil
}

// A sequential cutoff judges the requests' offsets, which a miniature sees unscaled: scale is not
// needed.
func newSeqCutoffSpec(params string, _ float64) (Admission, error) {
	if params == "" {
		return NewSeqCutoff(seqDefaultCutoff)
	}
	n, err := units.ParseSize(params)
	if err != nil {
		return nil, fmt.Errorf("cutoff: %w; %s", err, seqForm)
	}
	return NewSeqCutoff(n)
}

// Admit reports whether a's request is random I/O or within the first cutoff bytes of its stream.
func (s *SeqCutoff) Admit(a Access) bool {
	if a.Length <= 0 || a.Offset < 0 || a.Offset > math.MaxInt64-a.Length {
		return true // no extent to follow
	}
	s.clock++
	end := a.Offset + a.Length
	for i, e := range s.end {
		if e == end && s.start[i] == a.Offset {
			s.used[i] = s.clock
			return s.admit[i]
		}
	}
	for i, e := range s.end {
		if e == a.Offset {
			s.start[i], s.end[i] = a.Offset, end
			s.length[i] = min(s.length[i], math.MaxInt64-a.Length) + a.Length
			s.admit[i] = s.length[i] <= s.cutoff
			s.used[i] = s.clock
			return s.admit[i]
		}
	}
	victim, oldest := 0, s.used[0]
	for i, u := range s.used {
		if u < oldest {
			victim, oldest = i, u
		}
	}
	s.start[victim], s.end[victim], s.length[victim] = a.Offset, end, a.Length
	s.admit[victim], s.used[victim] = true, s.clock
	return true
}
