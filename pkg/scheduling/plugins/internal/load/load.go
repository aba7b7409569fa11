// Package load turns per-endpoint load readings into scores, with one rule
// for endpoints whose metrics are stale.
package load

import "math"

// Unknown marks an endpoint whose load reading is stale.
var Unknown = math.NaN()

// IsUnknown reports whether v is the Unknown marker.
func IsUnknown(v float64) bool { return v != v }

// InverseMinMax rewrites out in place from load readings (Unknown for stale
// metrics) to scores: the least loaded known endpoint scores 1, the most
// loaded 0, linearly between; when every known reading is equal they all
// score 1.
//
// An unknown load is neither zero nor full: it scores the mean of the known
// endpoints' scores, so an endpoint whose scrape failed is neither preferred
// nor avoided on load alone (treating it as idle would pile requests onto a
// pod that may be drowning). With no known reading at all, every endpoint
// scores 0.5.
func InverseMinMax(out []float64) {
	lo, hi := math.Inf(1), math.Inf(-1)
	known := 0
	for _, v := range out {
		if IsUnknown(v) {
			continue
		}
		known++
		lo = math.Min(lo, v)
		hi = math.Max(hi, v)
	}
	if known == 0 {
		for i := range out {
			out[i] = 0.5
		}
		return
	}
	sum := 0.0
	for i, v := range out {
		if IsUnknown(v) {
			continue
		}
		s := 1.0
		if hi > lo {
			s = (hi - v) / (hi - lo)
		}
		out[i] = s
		sum += s
	}
	FillUnknown(out, sum/float64(known))
}

// FillUnknown sets every Unknown entry of out to v.
func FillUnknown(out []float64, v float64) {
	for i := range out {
		if IsUnknown(out[i]) {
			out[i] = v
		}
	}
}

// MeanKnown returns the mean of out's known entries and how many there are.
func MeanKnown(out []float64) (float64, int) {
	sum, n := 0.0, 0
	for _, v := range out {
		if !IsUnknown(v) {
			sum += v
			n++
		}
	}
	if n == 0 {
		return 0, 0
	}
	return sum / float64(n), n
}
