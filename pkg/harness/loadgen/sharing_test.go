package loadgen

import (
	"context"
	"fmt"
	"testing"

	"github.com/kvroute/kvroute/pkg/datalayer/share"
	"github.com/kvroute/kvroute/pkg/testkit"
)

// The default's replicas share their dispatches; the unshared policy's,
// with the same configuration, do not.
func TestTheUnsharedPolicyDiffersFromTheDefaultBySharingAlone(t *testing.T) {
	t.Parallel()
	if eppConfig(PolicyPredictedUnshared) != eppConfig(PolicyPredicted) || !viaEPP(PolicyPredictedUnshared) {
		t.Fatal("the unshared policy is not the default's configuration behind the gateway")
	}
	srv := testkit.StartNATS(t, testkit.NATSOptions{})
	for pol, want := range map[string]share.State{PolicyPredicted: share.StateSharing, PolicyPredictedUnshared: share.StateOff} {
		r, err := startKVRoute(context.Background(), ReplicaSpec{Name: "epp-0", Policy: pol, NATSURL: srv.URL(), Namespace: "ns", Pool: "pool", Model: "m", BlockSize: 16})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = r.Stop() })
		e := r.(*kvroute).e
		testkit.WaitFor(t, pol+"'s sharing state", func() error {
			if st := e.Share().State(); st != want {
				return fmt.Errorf("state %v, want %v", st, want)
			}
			return nil
		})
	}
}
