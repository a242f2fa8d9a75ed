package policy

import (
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// admitStep is one admission decision of a table test: the access and the expected answer.
type admitStep struct {
	a    Access
	want bool
}

// runAdmission feeds steps to a and checks each decision.
func runAdmission(t *testing.T, a Admission, steps []admitStep) {
	t.Helper()
	for i, s := range steps {
		require.Equal(t, s.want, a.Admit(s.a), "step %d: %+v", i, s.a)
	}
}

func TestAlways(t *testing.T) {
	a, err := NewAdmission("always")
	require.NoError(t, err)
	runAdmission(t, a, []admitStep{
		{Access{Key: 1}, true},
		{Access{Key: 1}, true},
		{Access{Key: 2, Offset: 1 << 30, Length: 1 << 20, Write: true}, true},
	})
}

// TestNewAdmission covers every admission spec form and the errors of bad ones, which must name the
// parameter and show the valid form.
func TestNewAdmission(t *testing.T) {
	tests := []struct {
		spec string
		want Admission // nil when an error is expected
		err  []string
	}{
		{"always", Always{}, nil},
		{"ALWAYS", Always{}, nil},
		{"always:2", nil, []string{"always takes no parameters", "write always"}},
		{"nhit", &NHit{n: 2, ring: make([]int32, 65536)}, nil},
		{"nhit:3", &NHit{n: 3, ring: make([]int32, 65536)}, nil},
		{"nhit:3,window=100", &NHit{n: 3, ring: make([]int32, 100)}, nil},
		{"nhit:window=100", &NHit{n: 2, ring: make([]int32, 100)}, nil},
		{"nhit: 4 , window = 8", &NHit{n: 4, ring: make([]int32, 8)}, nil},
		{"nhit:n=5", &NHit{n: 5, ring: make([]int32, 65536)}, nil},
		{"nhit:0", nil, []string{`N "0"`, "nhit:N,window=W"}},
		{"nhit:x", nil, []string{`N "x"`, "nhit:N,window=W"}},
		{"nhit:2,window=0", nil, []string{`window "0"`, "nhit:N,window=W"}},
		{"nhit:2,window=99999999", nil, []string{`window "99999999"`, "4194304"}},
		{"nhit:5,window=4", nil, []string{"N=5 exceeds window=4", "N <= W"}},
		{"nhit:2,size=4", nil, []string{`unknown parameter "size=4"`, "nhit:N,window=W"}},
		{"nhit:2,3", nil, []string{`unknown parameter "3"`}},
		{"seqcutoff", &SeqCutoff{cutoff: 4 << 20}, nil},
		{"seqcutoff:1MiB", &SeqCutoff{cutoff: 1 << 20}, nil},
		{"seqcutoff:65536", &SeqCutoff{cutoff: 65536}, nil},
		{"seqcutoff:0", nil, []string{"cutoff 0", "seqcutoff:SIZE"}},
		{"seqcutoff:4Mx", nil, []string{"cutoff:", "seqcutoff:SIZE"}},
		{"auto", NewAuto(), nil},
		{"auto:2", nil, []string{"auto takes no parameters", "write auto"}},
		{"nosuch", nil, []string{`unknown admission policy "nosuch"`, "always, auto, nhit, seqcutoff"}},
	}
	for _, tt := range tests {
		t.Run(tt.spec, func(t *testing.T) {
			a, err := NewAdmission(tt.spec)
			if tt.want == nil {
				for _, e := range tt.err {
					require.ErrorContains(t, err, e)
				}
				return
			}
			require.NoError(t, err)
			switch want := tt.want.(type) {
			case *NHit:
				got := a.(*NHit)
				require.Equal(t, want.n, got.n)
				require.Len(t, got.ring, len(want.ring))
			case *SeqCutoff:
				require.Equal(t, want.cutoff, a.(*SeqCutoff).cutoff)
			default:
				require.Equal(t, tt.want, a)
			}
		})
	}
}

// admissionStream is the admission benchmark's input: 1M misses of 64 KiB, half from four
// interleaved sequential streams, half random over 64 GiB with Zipf-skewed popularity.
var admissionStream = sync.OnceValue(func() []Access {
	r := rand.New(rand.NewPCG(5, 6))
	z := rand.NewZipf(r, 1.1, 1, 1<<20-1)
	const line = 64 << 10
	var next [4]int64
	for i := range next {
		next[i] = int64(i+1) << 40
	}
	s := make([]Access, benchAccesses)
	for i := range s {
		off := int64(z.Uint64()) * line
		if i%2 == 0 {
			j := i / 2 % len(next)
			off = next[j]
			next[j] += line
		}
		s[i] = Access{Key: Key(off / line), Offset: off, Length: line}
	}
	return s
})

func BenchmarkAdmission(b *testing.B) {
	stream := admissionStream()
	for _, name := range AdmissionNames() {
		b.Run(name, func(b *testing.B) {
			a, err := NewAdmission(name)
			if err != nil {
				b.Fatal(err)
			}
			for _, x := range stream { // warm up: fill nhit's window
				a.Admit(x)
			}
			admitted := 0
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				if a.Admit(stream[i&(benchAccesses-1)]) {
					admitted++
				}
			}
			b.ReportMetric(float64(admitted)/float64(b.N), "admit/op")
		})
	}
}

// A miniature cache's admission remembers rate times as many keys: nhit's window and auto's
// doorkeeper and epoch, never below what the policy needs.
func TestMiniatureAdmission(t *testing.T) {
	a, err := NewMiniatureAdmission("nhit:2,window=1000", 0.01)
	require.NoError(t, err)
	require.Equal(t, 10, len(a.(*NHit).ring))
	a, err = NewMiniatureAdmission("nhit:3,window=100", 0.001)
	require.NoError(t, err)
	require.Equal(t, 3, len(a.(*NHit).ring), "never below N")
	a, err = NewMiniatureAdmission("auto", 0.25)
	require.NoError(t, err)
	require.Equal(t, nhitDefaultWindow/4, len(a.(*Auto).door.ring))
	require.EqualValues(t, autoEpoch/4, a.(*Auto).epoch)
	_, err = NewMiniatureAdmission("auto", 0)
	require.ErrorContains(t, err, "must be above 0")
}
