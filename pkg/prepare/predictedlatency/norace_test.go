//go:build !race

package predictedlatency_test

const raceEnabled = false
