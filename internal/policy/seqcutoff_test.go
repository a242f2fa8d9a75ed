package policy

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

const kib = 1 << 10

// rq is a request of n KiB at off KiB.
func rq(off, n int64) Access { return Access{Key: Key(off / 64), Offset: off * kib, Length: n * kib} }

func TestSeqCutoff(t *testing.T) {
	const gib = 1 << 20 // in KiB
	tests := []struct {
		name   string
		cutoff int64
		steps  []admitStep
	}{
		{"one stream", 256 * kib, []admitStep{
			{rq(0, 64), true},    // a new stream: random I/O is admitted
			{rq(64, 64), true},   // 128 KiB
			{rq(128, 64), true},  // 192 KiB
			{rq(192, 64), true},  // 256 KiB: the cutoff is not exceeded yet
			{rq(256, 64), false}, // 320 KiB: bypassed
			{rq(320, 64), false},
			{rq(9000, 64), true}, // random I/O elsewhere
			{rq(384, 64), false}, // the stream goes on, still bypassed
		}},
		{"one request asked about per missed key", 128 * kib, []admitStep{
			{rq(0, 64), true}, {rq(0, 64), true}, // the same request twice: not a stream of 128 KiB
			{rq(64, 64), true}, {rq(64, 64), true}, // 128 KiB
			{rq(128, 64), false}, {rq(128, 64), false}, // 192 KiB, the same answer for each key
		}},
		{"interleaved streams each detected", 128 * kib, []admitStep{
			{rq(0, 64), true}, {rq(gib, 64), true}, {rq(2*gib, 64), true},
			{rq(64, 64), true}, {rq(gib+64, 64), true}, {rq(5000, 8), true}, {rq(2*gib+64, 64), true},
			{rq(128, 64), false}, {rq(gib+128, 64), false}, {rq(7000, 8), true}, {rq(2*gib+128, 64), false},
			{rq(2*gib+192, 64), false}, {rq(192, 64), false}, {rq(gib+192, 64), false},
		}},
		{"large random request", 128 * kib, []admitStep{
			{rq(0, 1024), true},    // longer than the cutoff, but random I/O: admitted
			{rq(1024, 64), false},  // its continuation is not
			{rq(4096, 1024), true}, // another random one
		}},
		{"reverse and strided I/O is random", 64 * kib, []admitStep{
			{rq(640, 64), true}, {rq(576, 64), true}, {rq(512, 64), true},
			{rq(0, 4), true}, {rq(8, 4), true}, {rq(16, 4), true},
		}},
		{"writes count as reads do", 64 * kib, []admitStep{
			{Access{Offset: 0, Length: 64 * kib, Write: true}, true},
			{Access{Offset: 64 * kib, Length: 64 * kib, Write: true}, false},
		}},
		{"no extent", 1, []admitStep{
			{Access{Key: 1}, true}, {Access{Key: 1}, true},
			{Access{Offset: -4096, Length: 4096}, true},
			{Access{Offset: math.MaxInt64 - 10, Length: 4096}, true},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := NewSeqCutoff(tt.cutoff)
			require.NoError(t, err)
			runAdmission(t, s, tt.steps)
		})
	}
}

// Stream slots are reused least recently used first: a stream idle for longer than seqStreams
// others have been active is forgotten, and starts again as new.
func TestSeqCutoffForgetsIdleStreams(t *testing.T) {
	s, err := NewSeqCutoff(64 * kib)
	require.NoError(t, err)
	start := func(i int64) int64 { return i << 20 } // stream i at i GiB, in KiB
	for i := range int64(seqStreams + 1) {
		require.True(t, s.Admit(rq(start(i), 64)), "stream %d starts", i)
	}
	// stream 1 is still tracked: its second request makes it longer than the cutoff
	require.False(t, s.Admit(rq(start(1)+64, 64)))
	// stream 0's slot went to stream seqStreams: it is new again
	require.True(t, s.Admit(rq(start(0)+64, 64)))
	require.False(t, s.Admit(rq(start(0)+128, 64)))
}
