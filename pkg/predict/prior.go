package predict

import (
	"fmt"
	"math"
)

// Prior is what a model believes before it has seen a response: latency
// as a sum of per-unit costs, in milliseconds. It is the cold start of
// every model (at start-up, after a restart, for a new endpoint of a class
// nothing has been learned of) and what each coefficient falls back to
// where observations say nothing about it. The defaults are those of an 8B
// model on one modern GPU (prefill about 20k tokens/s, a decode step about
// 10 ms), which is also what the simulator runs.
type Prior struct {
	// TTFTBaseMs is the time to first token of a request with nothing to
	// compute and nothing ahead of it (one engine step).
	TTFTBaseMs float64 `json:"ttftBaseMs"`
	// TTFTPerUncachedTokenMs is the prefill cost of one prompt token not
	// cached anywhere.
	TTFTPerUncachedTokenMs float64 `json:"ttftPerUncachedTokenMs"`
	// TTFTPerCPUTokenMs and TTFTPerStorageTokenMs are what a token cached
	// only in the CPU tier or in storage costs to load back.
	TTFTPerCPUTokenMs     float64 `json:"ttftPerCpuTokenMs"`
	TTFTPerStorageTokenMs float64 `json:"ttftPerStorageTokenMs"`
	// TTFTPerWaitingMs is the wait behind each request in the endpoint's
	// queue; TTFTPerQueuedPrefillTokenMs the wait behind each prompt token
	// this EPP dispatched there and has not seen begin decoding.
	TTFTPerWaitingMs            float64 `json:"ttftPerWaitingMs"`
	TTFTPerQueuedPrefillTokenMs float64 `json:"ttftPerQueuedPrefillTokenMs"`
	// TPOTBaseMs is a decode step of a batch of one; TPOTPerRunningMs what
	// each other running sequence adds to it.
	TPOTBaseMs       float64 `json:"tpotBaseMs"`
	TPOTPerRunningMs float64 `json:"tpotPerRunningMs"`
}

// DefaultPrior is the prior a predictor configured without one starts from.
func DefaultPrior() Prior {
	return Prior{
		TTFTBaseMs:                  15,
		TTFTPerUncachedTokenMs:      0.05,
		TTFTPerCPUTokenMs:           0.005,
		TTFTPerStorageTokenMs:       0.02,
		TTFTPerWaitingMs:            40,
		TTFTPerQueuedPrefillTokenMs: 0.05,
		TPOTBaseMs:                  9,
		TPOTPerRunningMs:            0.3,
	}
}

// Validate reports a prior with a coefficient that is negative or not a
// number: a latency cannot be made shorter by more work.
func (p Prior) Validate() error {
	for name, v := range map[string]float64{
		"ttftBaseMs": p.TTFTBaseMs, "ttftPerUncachedTokenMs": p.TTFTPerUncachedTokenMs,
		"ttftPerCpuTokenMs": p.TTFTPerCPUTokenMs, "ttftPerStorageTokenMs": p.TTFTPerStorageTokenMs,
		"ttftPerWaitingMs": p.TTFTPerWaitingMs, "ttftPerQueuedPrefillTokenMs": p.TTFTPerQueuedPrefillTokenMs,
		"tpotBaseMs": p.TPOTBaseMs, "tpotPerRunningMs": p.TPOTPerRunningMs,
	} {
		if !(v >= 0) || math.IsInf(v, 0) {
			return fmt.Errorf("prior %s = %v, want a finite value ≥ 0", name, v)
		}
	}
	return nil
}

// ttft is the prior's TTFT coefficients over TTFTFeatures.
func (p Prior) ttft() Vector {
	var v Vector
	v[0] = p.TTFTBaseMs
	v[1] = p.TTFTPerUncachedTokenMs * 1e3
	v[3] = p.TTFTPerCPUTokenMs * 1e3
	v[4] = p.TTFTPerStorageTokenMs * 1e3
	v[5] = p.TTFTPerUncachedTokenMs * 1e3 / 2 // as likely computed by then as not
	v[7] = p.TTFTPerWaitingMs
	v[10] = p.TTFTPerQueuedPrefillTokenMs * 1e3
	return v
}

// tpot is the prior's TPOT coefficients over TPOTFeatures.
func (p Prior) tpot() Vector {
	var v Vector
	v[0] = p.TPOTBaseMs
	v[1] = p.TPOTPerRunningMs
	return v
}
