//go:build race

package prefixmatch_test

// raceEnabled: the race detector makes sync.Pool drop items at random.
const raceEnabled = true
