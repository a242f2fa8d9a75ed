// Package crc32c computes CRC-32C (Castagnoli): the checksums of the SSD tier's blocks, of the run
// log's records and of iSCSI's digests. It is hash/crc32's Castagnoli CRC with the same values,
// computed by whichever of two ways is faster on the CPU it runs on, chosen once at start-up by
// timing both on a block: the CPU's CRC instruction (hash/crc32: SSE4.2, ARMv8), or slicing-by-8
// tables in plain Go. The instruction wins by far on real hardware; on a CPU that emulates it
// (qemu's TCG, which the kernel tests and `tierblk bench kernel` run under) each instruction is a
// call into the emulator, and the tables win (TestPick's log shows the two timings on the machine
// that runs it).
//
// It must never return another value than hash/crc32's Castagnoli CRC: sums it wrote are read
// back by another run, perhaps on another CPU that chose the other way.
package crc32c

import (
	"hash/crc32"
	"time"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Update returns the CRC-32C of p appended to data whose CRC-32C was crc, as crc32.Update does.
func Update(crc uint32, p []byte) uint32 {
	if useTables {
		return updateTables(crc, p)
	}
	return crc32.Update(crc, castagnoli, p)
}

// Checksum returns the CRC-32C of p.
func Checksum(p []byte) uint32 { return Update(0, p) }

// Impl names the way Update computes the CRC on this CPU: "instruction" or "tables".
func Impl() string {
	if useTables {
		return "tables"
	}
	return "instruction"
}

// useTables is the choice pick made at start-up; it never changes after.
var useTables = pick(timeBoth)

// pick reports whether the tables are the faster way, from the timings measure gives for the
// instruction and for the tables (the least of a few rounds each).
func pick(measure func() (instr, tables time.Duration)) bool {
	instr, tables := measure()
	return tables < instr
}

// timeBoth times both ways over one 4 KiB block, the SSD tier's unit, in alternating rounds, and
// returns the least time of each: a round that another thread preempted counts for nothing.
func timeBoth() (instr, tables time.Duration) {
	var blk [4096]byte
	for i := range blk {
		blk[i] = byte(i * 131)
	}
	instr, tables = time.Hour, time.Hour
	for range 5 {
		t0 := time.Now()
		crc32.Update(0, castagnoli, blk[:])
		t1 := time.Now()
		updateTables(0, blk[:])
		t2 := time.Now()
		instr, tables = min(instr, t1.Sub(t0)), min(tables, t2.Sub(t1))
	}
	return instr, tables
}

// slicing8 holds the eight tables of slicing-by-8: slicing8[0] is the byte-at-a-time table of the
// reflected polynomial, slicing8[k][b] the CRC of byte b followed by k zero bytes.
var slicing8 = func() (t [8][256]uint32) {
	for i := range 256 {
		c := uint32(i)
		for range 8 {
			if c&1 != 0 {
				c = c>>1 ^ 0x82f63b78 // Castagnoli, reflected
			} else {
				c >>= 1
			}
		}
		t[0][i] = c
	}
	for i := range 256 {
		for k := 1; k < 8; k++ {
			t[k][i] = t[k-1][i]>>8 ^ t[0][byte(t[k-1][i])]
		}
	}
	return t
}()

// updateTables is Update by slicing-by-8: eight bytes a step, each through its own table.
func updateTables(crc uint32, p []byte) uint32 {
	t := &slicing8
	crc = ^crc
	for len(p) >= 8 {
		crc ^= uint32(p[0]) | uint32(p[1])<<8 | uint32(p[2])<<16 | uint32(p[3])<<24
		crc = t[0][p[7]] ^ t[1][p[6]] ^ t[2][p[5]] ^ t[3][p[4]] ^
			t[4][crc>>24] ^ t[5][crc>>16&0xff] ^ t[6][crc>>8&0xff] ^ t[7][crc&0xff]
		p = p[8:]
	}
	for _, b := range p {
		crc = t[0][byte(crc)^b] ^ crc>>8
	}
	return ^crc
}
