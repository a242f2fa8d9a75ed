package bench

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tierblk/tierblk/internal/cache"
)

func TestReductionTargets(t *testing.T) {
	targets := reductionTargets("/bin/tierblk", "/work", "r", "/img/usr.ext4", 1<<30, imageTargets)
	serve := func(image, ssd, reduction string) string {
		return "/bin/tierblk serve --backend file://" + image + " --read-only --nbd unix:/t.sock --ram 0 --ssd /work/" + ssd +
			"-ssd.img --ssd-size 1073741824 --admission always --congestion off --reduction " + reduction + " --admin unix:/work/" + ssd + "-admin.sock --log-level warn"
	}
	wbServe := func(reduction string) string {
		return "/bin/tierblk serve --backend file:///work/" + reduction + "-wb-backend.img?size=1GiB --nbd unix:/t.sock --ram 0 --ssd /work/" + reduction +
			"-wb-ssd.img --ssd-size 1GiB --mode writeback --admission always --congestion off --reduction " + reduction + " --log-level warn"
	}
	want := []struct{ name, cmd string }{
		{nameReductionOff, serve("/img/usr.ext4", "roff", "off")},
		{nameReductionZero, serve("/img/usr.ext4", "rzero", "zero")},
		{nameReductionCompress, serve("/img/usr.ext4", "rcompress", "compress")},
		{nameRandomOff, serve("/work/random.img", "xoff", "off")},
		{nameRandomCompress, serve("/work/random.img", "xcompress", "compress")},
		{nameWriteBackOff, wbServe("off")},
		{nameWriteBackZero, wbServe("zero")},
		{nameWriteBackCompress, wbServe("compress")},
		{nameClonesDedupe, serve("/work/clones.img", "ddedupe", "dedupe")},
		{nameClonesCompress, serve("/work/clones.img", "dcompress", "compress")},
		{nameCloneDedupe, serve("/work/clone0.img", "cdedupe", "dedupe")},
	}
	targets = append(targets, reductionTargets("/bin/tierblk", "/work", "x", "/work/random.img", 1<<30, randomTargets)...)
	targets = append(targets, writeBackTargets("/bin/tierblk", "/work")...)
	targets = append(targets, reductionTargets("/bin/tierblk", "/work", "d", "/work/clones.img", 1<<30, clonesTargets)...)
	targets = append(targets, reductionTargets("/bin/tierblk", "/work", "c", "/work/clone0.img", 1<<30, cloneTargets)...)
	require.Len(t, targets, len(want))
	for i, tg := range targets {
		require.Equal(t, want[i].name, tg.Name)
		require.Equal(t, want[i].cmd, strings.Join(tg.Command("/t.sock").Args, " "))
	}
	// The literal form of one, so that the helpers above cannot hide a change of shape.
	require.Equal(t, "/bin/tierblk serve --backend file:///img/usr.ext4 --read-only --nbd unix:/t.sock --ram 0 --ssd /work/rcompress-ssd.img --ssd-size 1073741824 --admission always --congestion off --reduction compress --admin unix:/work/rcompress-admin.sock --log-level warn",
		strings.Join(targets[2].Command("/t.sock").Args, " "))
}

func TestReductionSSDSize(t *testing.T) {
	// 2 GiB and 1/7 on top, plus two lines, in whole lines: room for every line and the slots set aside.
	require.Equal(t, int64(2454388736), reductionSSDSize(2<<30))
	require.Zero(t, reductionSSDSize(8<<20+12345)%cache.DefaultLineSize)
	require.GreaterOrEqual(t, reductionSSDSize(8<<20)*7/8, int64(8<<20))
}

func TestReductionTable(t *testing.T) {
	var out bytes.Buffer
	ReductionTable(&out, ReductionReport{
		Stored: map[string]cache.TierStats{
			nameReductionOff:      {LogicalBytes: 1 << 30, PhysicalBytes: 1 << 30},
			nameReductionZero:     {LogicalBytes: 1 << 30, PhysicalBytes: 384 << 20},
			nameReductionCompress: {LogicalBytes: 1 << 30, PhysicalBytes: 256 << 20},
			nameRandomOff:         {LogicalBytes: 256 << 20, PhysicalBytes: 256 << 20},
			nameRandomCompress:    {LogicalBytes: 256 << 20, PhysicalBytes: 256 << 20},
		},
		Fill: map[string]time.Duration{nameReductionOff: 4 * time.Second, nameReductionZero: 2500 * time.Millisecond,
			nameReductionCompress: 3 * time.Second, nameRandomOff: time.Second, nameRandomCompress: 1200 * time.Millisecond},
		Hits: []Result{{Row: "4K", Unit: "IOPS", Samples: map[string][]float64{
			nameReductionOff: {100, 200, 300}, nameReductionZero: {110, 180, 330}, nameReductionCompress: {90, 200, 330},
		}}},
		Random: Result{Row: "4K random", Unit: "IOPS", Samples: map[string][]float64{
			nameRandomOff: {100, 200, 300}, nameRandomCompress: {97, 200, 270},
		}},
		Writes: Result{Row: "4K write", Unit: "IOPS", Samples: map[string][]float64{
			nameWriteBackOff: {1000, 2000}, nameWriteBackZero: {900, 2000}, nameWriteBackCompress: {800, 1800},
		}},
	})
	require.Equal(t, `| SSD tier | logical | physical | physical/logical | first read of the image |
|---|---:|---:|---:|---:|
| tierblk --reduction off | 1024.0 MiB | 1024.0 MiB | 1.000 | 4.0 s |
| tierblk --reduction zero | 1024.0 MiB | 384.0 MiB | 0.375 | 2.5 s |
| tierblk --reduction compress | 1024.0 MiB | 256.0 MiB | 0.250 | 3.0 s |
| random bytes, --reduction off | 256.0 MiB | 256.0 MiB | 1.000 | 1.0 s |
| random bytes, --reduction compress | 256.0 MiB | 256.0 MiB | 1.000 | 1.2 s |

| workload | tierblk --reduction compress | tierblk --reduction zero | tierblk --reduction off | tierblk --reduction compress / tierblk --reduction off (min-max) | tierblk --reduction zero / tierblk --reduction off (min-max) |
|---|---:|---:|---:|---:|---:|
| 4K | 200 IOPS | 180 IOPS | 200 IOPS | 1.00 (0.90-1.10) | 1.10 (0.90-1.10) |

| workload | random bytes, --reduction compress | random bytes, --reduction off | random bytes, --reduction compress / random bytes, --reduction off (min-max) |
|---|---:|---:|---:|
| 4K random | 200 IOPS | 200 IOPS | 0.97 (0.90-1.00) |

| workload | writeback --reduction compress | writeback --reduction zero | writeback --reduction off | writeback --reduction compress / writeback --reduction off (min-max) | writeback --reduction zero / writeback --reduction off (min-max) |
|---|---:|---:|---:|---:|---:|
| 4K write | 1300 IOPS | 1450 IOPS | 1500 IOPS | 0.85 (0.80-0.90) | 0.95 (0.90-1.00) |
`, out.String())
}

// cloneImage is a small image like a file system's: lines of text (compressible, and no block of it
// at an offset that is not a multiple of 4 KiB equals one at a multiple), two blocks of the same
// bytes, then zeros.
func cloneImage(t *testing.T, size int) (string, []byte) {
	t.Helper()
	var b bytes.Buffer
	for i := 0; b.Len() < size/2; i++ {
		fmt.Fprintf(&b, "line %d of the clone image, some words to compress\n", i)
	}
	data := make([]byte, size)
	copy(data, b.Bytes()[:size/2])
	copy(data[10*cloneBlock:11*cloneBlock], data[:cloneBlock])
	path := filepath.Join(t.TempDir(), "image.img")
	require.NoError(t, os.WriteFile(path, data, 0o600))
	return path, data
}

func TestMakeClones(t *testing.T) {
	const size = 2 << 20
	image, data := cloneImage(t, size)
	dir := t.TempDir()
	one, four := filepath.Join(dir, "one.img"), filepath.Join(dir, "four.img")
	cs, err := makeClones(image, size, one, four)
	require.NoError(t, err)
	n := int64(size / cloneBlock)
	require.Equal(t, CloneSet{Size: size, Blocks: n, Rewritten: n * 5 / 100}, CloneSet{Size: cs.Size, Blocks: cs.Blocks, Rewritten: cs.Rewritten})
	clones, err := os.ReadFile(four)
	require.NoError(t, err)
	require.Len(t, clones, DedupeClones*size)
	clone0, err := os.ReadFile(one)
	require.NoError(t, err)
	require.Equal(t, clones[:size], clone0, "clone 0 alone is the first clone of the four")

	imageBlocks := map[string]bool{}
	for p := 0; p < size; p += cloneBlock {
		imageBlocks[string(data[p:p+cloneBlock])] = true
	}
	zero := make([]byte, cloneBlock)
	scratch := make([]byte, 8192)
	unit := func(b []byte) int64 {
		if bytes.Equal(b, zero) {
			return 0
		}
		return unitBytes(scratch, b)
	}
	newBlocks := map[string]bool{}
	var expectCompress int64
	distinct := map[string]int64{}
	for c := range DedupeClones {
		clone := clones[c*size : (c+1)*size]
		var rewritten, wasZero, newBytes int64
		for p := 0; p < size; p += cloneBlock {
			b := clone[p : p+cloneBlock]
			expectCompress += unit(b)
			distinct[string(b)] = unit(b)
			if bytes.Equal(b, data[p:p+cloneBlock]) {
				continue
			}
			rewritten++
			if bytes.Equal(data[p:p+cloneBlock], zero) {
				wasZero++
			}
			require.False(t, bytes.Equal(b, zero), "a new block is data")
			require.False(t, imageBlocks[string(b)], "a new block matches no block of the image")
			require.False(t, newBlocks[string(b)], "nor another new block")
			newBlocks[string(b)] = true
			i := bytes.Index(data, b)
			require.Positive(t, i%cloneBlock, "a new block is the image's bytes at an offset that is not a multiple of 4 KiB")
			newBytes += unitBytes(scratch, b)
		}
		require.Equal(t, cs.Rewritten, rewritten, "clone %d", c)
		require.Equal(t, wasZero, cs.WasZero[c], "clone %d", c)
		require.Equal(t, newBytes, cs.NewBytes[c], "clone %d", c)
		require.Less(t, newBytes, rewritten*cloneBlock, "clone %d: its new blocks compress as the image does", c)
		if c == 0 {
			var expect int64
			for _, u := range distinct {
				expect += u
			}
			require.Equal(t, expect, cs.ExpectOne)
		}
	}
	var expectFour int64
	for _, u := range distinct {
		expectFour += u
	}
	require.Equal(t, expectFour, cs.ExpectFour)
	require.Equal(t, expectCompress, cs.ExpectFourCompress)
	require.Greater(t, cs.ExpectFour, cs.ExpectOne)
	require.Less(t, cs.ExpectFour, cs.ExpectFourCompress)

	// The same seeds make the same clones.
	one2, four2 := filepath.Join(dir, "one2.img"), filepath.Join(dir, "four2.img")
	cs2, err := makeClones(image, size, one2, four2)
	require.NoError(t, err)
	require.Equal(t, cs, cs2)
	clones2, err := os.ReadFile(four2)
	require.NoError(t, err)
	require.True(t, bytes.Equal(clones, clones2))
	// The files are new ones.
	_, err = makeClones(image, size, one2, filepath.Join(dir, "four3.img"))
	require.ErrorIs(t, err, os.ErrExist)
}

func TestMakeClonesRefusesAnImageWithoutData(t *testing.T) {
	dir := t.TempDir()
	image := filepath.Join(dir, "zeros.img")
	require.NoError(t, os.WriteFile(image, make([]byte, 1<<20), 0o600))
	_, err := makeClones(image, 1<<20, filepath.Join(dir, "one.img"), filepath.Join(dir, "four.img"))
	require.ErrorContains(t, err, "too little data")
	// One byte over and over: every 4 KiB of it, wherever it starts, is every block.
	require.NoError(t, os.WriteFile(image, bytes.Repeat([]byte{7}, 1<<20), 0o600))
	_, err = makeClones(image, 1<<20, filepath.Join(dir, "one2.img"), filepath.Join(dir, "four2.img"))
	require.ErrorContains(t, err, "too little data")
}

func TestDedupeTable(t *testing.T) {
	rep := ReductionReport{
		Stored: map[string]cache.TierStats{
			nameCloneDedupe:    {LogicalBytes: 1 << 30, PhysicalBytes: 256 << 20, DedupeHits: 1000},
			nameClonesDedupe:   {LogicalBytes: 4 << 30, PhysicalBytes: 320 << 20, DedupeHits: 700000, DedupeCollisions: 2},
			nameClonesCompress: {LogicalBytes: 4 << 30, PhysicalBytes: 1 << 30},
		},
		Fill: map[string]time.Duration{nameCloneDedupe: 2 * time.Second, nameClonesDedupe: 8 * time.Second, nameClonesCompress: 7 * time.Second},
		Clones: CloneSet{Size: 1 << 30, Blocks: 1 << 18, Rewritten: 13107, WasZero: [DedupeClones]int64{6000, 6001, 6002, 6003},
			NewBytes:  [DedupeClones]int64{25 << 20, 26 << 20, 27 << 20, 28 << 19},
			ExpectOne: 255 << 20, ExpectFour: 319 << 20, ExpectFourCompress: 1023 << 20},
	}
	d, c := rep.DedupeRatios()
	require.Equal(t, 1.25, d)
	require.Equal(t, 4.0, c)
	var out bytes.Buffer
	DedupeTable(&out, rep)
	require.Equal(t, `Dedupe: 4 clones of the image (1024.0 MiB each), 13107 of each one's 262144 blocks of 4 KiB (5 %) rewritten with 4 KiB of the image read at an offset that is not a multiple of 4 KiB (of them, blocks of zeros in the image: 6000 6001 6002 6003; their S2 units, MiB: 25.0 26.0 27.0 14.0); the four served as one export; one run:

| SSD tier | logical | physical | expected physical | dedupe hits | dedupe collisions | first read |
|---|---:|---:|---:|---:|---:|---:|
| clone 0, --reduction dedupe | 1024.0 MiB | 256.0 MiB | 255.0 MiB | 1000 | 0 | 2.0 s |
| four clones, --reduction dedupe | 4096.0 MiB | 320.0 MiB | 319.0 MiB | 700000 | 2 | 8.0 s |
| four clones, --reduction compress | 4096.0 MiB | 1024.0 MiB | 1023.0 MiB | 0 | 0 | 7.0 s |

Physical bytes of the four clones over clone 0's: dedupe 1.250 (goal: at most 1.4), compress 4.000
`, out.String())
	// ReductionTable ends with it, when there are clones (TestReductionTable: none, no such table).
	dedupe := out.String()
	out.Reset()
	rep.Random = Result{Row: "4K random", Unit: "IOPS", Samples: map[string][]float64{nameRandomOff: {1}, nameRandomCompress: {1}}}
	rep.Writes = Result{Row: "4K write", Unit: "IOPS", Samples: map[string][]float64{nameWriteBackOff: {1}, nameWriteBackZero: {1}, nameWriteBackCompress: {1}}}
	ReductionTable(&out, rep)
	require.True(t, strings.HasSuffix(out.String(), "|\n\n"+dedupe), out.String())
	require.Zero(t, ReductionReport{}.Clones.Size)
	d, c = ReductionReport{}.DedupeRatios()
	require.Zero(t, d)
	require.Zero(t, c)
}
