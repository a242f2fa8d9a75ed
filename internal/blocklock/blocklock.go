// Package blocklock serialises the read-modify-write of partial blocks in the backends that write
// whole blocks only (the file backend in direct mode, an iSCSI LUN): a fixed set of mutexes
// striped by block number, so that two writers patching different parts of one block do not lose
// each other's bytes. It must never be taken around whole-block writes, which need no lock.
package blocklock

import "sync"

// Stripes is the set of locks; the zero value is ready.
type Stripes [64]sync.Mutex

// Lock locks the stripes of blocks first and last, in a fixed order so that two writers cannot
// deadlock, and returns the unlock function.
func (s *Stripes) Lock(first, last int64) (unlock func()) {
	n := int64(len(s))
	a, b := first%n, last%n
	if a > b {
		a, b = b, a
	}
	s[a].Lock()
	if a == b {
		return s[a].Unlock
	}
	s[b].Lock()
	return func() { s[b].Unlock(); s[a].Unlock() }
}
