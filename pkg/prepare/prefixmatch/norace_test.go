//go:build !race

package prefixmatch_test

const raceEnabled = false
