//go:build race

package volume

// raceEnabled: under the race detector sync.Pool drops some of what is put back, on purpose.
const raceEnabled = true
