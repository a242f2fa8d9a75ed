// Package testenv decides what a test does on a machine that lacks a capability it needs (direct
// I/O in the test's directory, io_uring): skip, as on a developer's laptop or in a container that
// forbids io_uring, or fail, where the environment says the machine has it. CI sets
// TIERBLK_REQUIRE (.ci/run) on a machine that has them all, so that a test that skips there, and
// no longer runs the path it was written for, turns CI red instead of passing unseen. For tests
// only.
package testenv

import (
	"os"
	"slices"
	"strings"
	"testing"
)

// The capabilities tests ask for, as TIERBLK_REQUIRE names them (comma-separated).
const (
	DirectIO = "direct-io" // O_DIRECT in the test's temporary directory
	IOUring  = "io_uring"
)

// required reports whether TIERBLK_REQUIRE lists capability.
func required(capability string) bool {
	return slices.Contains(strings.Split(os.Getenv("TIERBLK_REQUIRE"), ","), capability)
}

// Skip skips t, which cannot run without capability, saying why; it fails t instead where
// TIERBLK_REQUIRE lists the capability.
func Skip(t testing.TB, capability, why string) {
	t.Helper()
	if required(capability) {
		t.Fatalf("%s, and TIERBLK_REQUIRE says this machine has %s", why, capability)
	}
	t.Skipf("%s (no %s here)", why, capability)
}

// Without is Skip for a test that goes on without the capability, leaving out a part of what it
// runs (the requests on a ring, say): it logs why, or fails t where TIERBLK_REQUIRE lists it.
func Without(t testing.TB, capability, why string) {
	t.Helper()
	if required(capability) {
		t.Fatalf("%s, and TIERBLK_REQUIRE says this machine has %s", why, capability)
	}
	t.Logf("%s (no %s here)", why, capability)
}
