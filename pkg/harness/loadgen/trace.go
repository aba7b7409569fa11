package loadgen

import (
	"context"
	"fmt"

	"github.com/kvroute/kvroute/pkg/predict"
)

// RecordTrace runs p's workload in virtual time at each of its rates
// under kvroute-prefill-cost with the latency producer watching, and
// returns every response it recorded: what was known at the pick, and the
// TTFT and TPOT that followed. The routing does not depend on any
// predictor, so every learning method is judged on the same trace.
func RecordTrace(ctx context.Context, fo FleetOptions, p Plan, o RunOptions) ([]predict.Sample, error) {
	if p.GPUBlocks > 0 {
		fo.Pool.GPUBlocks = p.GPUBlocks
	}
	if len(p.Speeds) > 0 {
		fo.Speeds = p.Speeds
	}
	var trace []predict.Sample
	o.Record = func(s predict.Sample) { trace = append(trace, s) }
	for _, rate := range p.Rates {
		o.Rate = rate
		if _, err := RunVirtual(ctx, policyTrace, fo, p.Workload, o); err != nil {
			return nil, fmt.Errorf("loadgen: trace of %s at %.1f req/s: %w", p.Workload.Name, rate, err)
		}
	}
	return trace, nil
}
