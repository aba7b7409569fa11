//go:build !race

package latency_test

const raceEnabled = false
