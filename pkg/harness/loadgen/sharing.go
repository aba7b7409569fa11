package loadgen

import "slices"

// PolicyPredictedUnshared is the default profile (PolicyPredicted) with
// its replicas' dispatch sharing off: each replica's in-flight accounting
// then counts its own dispatches only, as if it routed alone. With one
// replica the two are the same; with several, the pair shows what sharing
// buys.
const PolicyPredictedUnshared = "kvroute-predicted-latency-unshared"

// SharingPolicies are the policies that differ from AllPolicies' by
// dispatch sharing alone.
var SharingPolicies = []string{PolicyPredictedUnshared}

// shareDisabled says whether a policy's replicas keep their own view.
func shareDisabled(policy string) bool { return policy == PolicyPredictedUnshared }

// sharingPoliciesNote is the report's description of the sharing
// policies that ran, if any.
func sharingPoliciesNote(o BenchOptions) string {
	if !slices.ContainsFunc(o.Policies, shareDisabled) {
		return ""
	}
	return "| policy | how it routes |\n|---|---|\n| " + PolicyPredictedUnshared +
		" | the default's configuration, its replicas' dispatch sharing off: each replica's in-flight accounting (the predictor's load features) counts its own dispatches only, where the default's replicas count every replica's (`kv.dispatch.<namespace>.<pool>`) |\n\n"
}
