package bench

import (
	"bytes"
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"os"

	"github.com/klauspost/compress/s2"
)

// The dedupe rows of the reduction part: clones of the image, each with a few of its
// blocks rewritten, as the disks of VMs made from one template drift apart.
const (
	// DedupeClones is how many clones are served together as one export.
	DedupeClones = 4
	// DedupeRewritePercent is the share of each clone's 4 KiB blocks rewritten with new data.
	DedupeRewritePercent = 5
	// DedupeGoal is the goal: the clones together store at most this many times one clone's
	// physical bytes.
	DedupeGoal = 1.4
)

// cloneBlock is the block the clones are rewritten in, and the SSD tier's unit of dedupe.
const cloneBlock = 4096

// cloneMaxTries bounds the draws of a source for one rewritten block: an image with too little
// data that matches no block of its own (mostly zeros, or one pattern over and over) is refused.
const cloneMaxTries = 1000

// CloneSet is what makeClones made.
type CloneSet struct {
	Size      int64               // bytes of each clone: the image's whole lines
	Blocks    int64               // 4 KiB blocks in each clone
	Rewritten int64               // blocks rewritten in each clone
	WasZero   [DedupeClones]int64 // of those, the blocks that were zeros in the image, per clone
	NewBytes  [DedupeClones]int64 // the S2 units of each clone's new blocks (see unitBytes)
	// Expected is what an SSD tier would store of clone 0 alone (ExpectOne) and of the four clones
	// (ExpectFour) if it kept each distinct non-zero block once, as its S2 unit: dedupe that finds
	// every block it could; ExpectFourCompress the four clones with every non-zero block stored
	// (compress). Computed from 64-bit hashes of the blocks.
	ExpectOne, ExpectFour, ExpectFourCompress int64
}

// unitBytes is what the SSD tier's packed layout stores of a non-zero 4 KiB block: its S2
// encoding, or the block as it is when that is not under 7/8 of it (compressedMax in
// internal/cache/pack.go).
func unitBytes(scratch, b []byte) int64 {
	if n := len(s2.Encode(scratch, b)); n <= cloneBlock*7/8 {
		return int64(n)
	}
	return cloneBlock
}

// makeClones writes DedupeClones clones of the first size bytes of image (a multiple of 4 KiB)
// one after another to the new file four, and clone 0 alone to the new file one. Each clone is
// the image with DedupeRewritePercent of its 4 KiB blocks, drawn by an RNG seeded per clone,
// rewritten with new data like the image's: 4 KiB of the image read from an offset drawn at
// random that is not a multiple of 4 KiB; a draw whose bytes are all zeros, or equal a block of
// the image or of an earlier rewrite, is drawn again, so that every new block is data that
// matches no other block.
func makeClones(image string, size int64, one, four string) (CloneSet, error) {
	if size%cloneBlock != 0 || size < 2*cloneBlock {
		return CloneSet{}, fmt.Errorf("clones of %s: %d bytes, want a multiple of 4KiB of at least 8KiB", image, size)
	}
	img, err := os.Open(image)
	if err != nil {
		return CloneSet{}, err
	}
	defer img.Close()
	n := size / cloneBlock
	cs := CloneSet{Size: size, Blocks: n, Rewritten: n * DedupeRewritePercent / 100}
	seed := maphash.MakeSeed()
	hash := func(b []byte) uint64 { return maphash.Bytes(seed, b) }
	zero := make([]byte, cloneBlock)
	scratch := make([]byte, s2.MaxEncodedLen(cloneBlock))

	// The image's blocks: each one's hash, and the unit of each distinct non-zero one.
	hashes := make([]uint64, n)
	units := map[uint64]int64{} // hash → unit bytes, of non-zero blocks only
	chunk := make([]byte, 1<<20)
	for off := int64(0); off < size; off += int64(len(chunk)) {
		c := chunk[:min(int64(len(chunk)), size-off)]
		if _, err := img.ReadAt(c, off); err != nil {
			return CloneSet{}, fmt.Errorf("reading %s: %w", image, err)
		}
		for i := 0; i < len(c); i += cloneBlock {
			b := c[i : i+cloneBlock]
			h := hash(b)
			hashes[(off+int64(i))/cloneBlock] = h
			if _, ok := units[h]; !ok && !bytes.Equal(b, zero) {
				units[h] = unitBytes(scratch, b)
			}
		}
	}

	// The rewrites: for each clone, block → the offset its new data is read from.
	sources := make([]map[int64]int64, DedupeClones)
	rewrittenBy := make([]uint8, n) // bit c: clone c rewrote the block
	used := map[uint64]bool{}       // the new blocks so far
	buf := make([]byte, cloneBlock)
	for c := range DedupeClones {
		rng := rand.New(rand.NewPCG(uint64(c)+1, 26)) // clone c's own seed
		src := make(map[int64]int64, cs.Rewritten)
		for int64(len(src)) < cs.Rewritten {
			p := rng.Int64N(n)
			if _, ok := src[p]; ok {
				continue
			}
			for try := 0; ; try++ {
				if try == cloneMaxTries {
					return CloneSet{}, fmt.Errorf("clones of %s: no 4KiB of it at an unaligned offset that is not zeros and matches none of its blocks in %d draws: the image has too little data to rewrite blocks with", image, cloneMaxTries)
				}
				from := rng.Int64N(n-1)*cloneBlock + 1 + rng.Int64N(cloneBlock-1) // within the image, never on a 4 KiB boundary
				if _, err := img.ReadAt(buf, from); err != nil {
					return CloneSet{}, fmt.Errorf("reading %s: %w", image, err)
				}
				h := hash(buf)
				if _, ok := units[h]; ok || used[h] || bytes.Equal(buf, zero) {
					continue
				}
				used[h] = true
				src[p] = from
				cs.NewBytes[c] += unitBytes(scratch, buf)
				break
			}
			rewrittenBy[p] |= 1 << c
			if _, ok := units[hashes[p]]; !ok {
				cs.WasZero[c]++
			}
		}
		sources[c] = src
	}

	// What a tier that stores each distinct non-zero block once would hold, and one that stores
	// every one of them.
	distinct := func(clones uint8) int64 {
		seen := map[uint64]bool{}
		var total int64
		for p, h := range hashes {
			if rewrittenBy[p]&clones == clones || seen[h] { // rewritten in every clone served
				continue
			}
			seen[h] = true
			total += units[h] // 0 for a zero block
		}
		for c := range DedupeClones {
			if clones&(1<<c) != 0 {
				total += cs.NewBytes[c] // each new block is distinct
			}
		}
		return total
	}
	cs.ExpectOne, cs.ExpectFour = distinct(1), distinct(1<<DedupeClones-1)
	for c := range DedupeClones {
		for p, h := range hashes {
			if rewrittenBy[p]&(1<<c) == 0 {
				cs.ExpectFourCompress += units[h]
			}
		}
		cs.ExpectFourCompress += cs.NewBytes[c]
	}

	// The files.
	create := func(path string) (*os.File, error) {
		return os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	}
	f1, err := create(one)
	if err != nil {
		return CloneSet{}, err
	}
	defer f1.Close()
	f4, err := create(four)
	if err != nil {
		return CloneSet{}, err
	}
	defer f4.Close()
	for c := range DedupeClones {
		for off := int64(0); off < size; off += int64(len(chunk)) {
			ch := chunk[:min(int64(len(chunk)), size-off)]
			if _, err := img.ReadAt(ch, off); err != nil {
				return CloneSet{}, fmt.Errorf("reading %s: %w", image, err)
			}
			for i := 0; i < len(ch); i += cloneBlock {
				if from, ok := sources[c][(off+int64(i))/cloneBlock]; ok {
					if _, err := img.ReadAt(ch[i:i+cloneBlock], from); err != nil {
						return CloneSet{}, fmt.Errorf("reading %s: %w", image, err)
					}
				}
			}
			if _, err := f4.WriteAt(ch, int64(c)*size+off); err != nil {
				return CloneSet{}, err
			}
			if c == 0 {
				if _, err := f1.WriteAt(ch, off); err != nil {
					return CloneSet{}, err
				}
			}
		}
	}
	if err := f1.Close(); err != nil {
		return CloneSet{}, err
	}
	return cs, f4.Close()
}
