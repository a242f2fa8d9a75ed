//go:build race

package sim

// raceEnabled: the race detector slows the replay about tenfold, so the long stream test is shorter.
const raceEnabled = true
