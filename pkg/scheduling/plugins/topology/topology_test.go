package topology_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/scheduling/config"
	"github.com/kvroute/kvroute/pkg/scheduling/internal/schedtest"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/topology"
)

func TestTheExtractorsPodLabelsOverrideTheNodesPlace(t *testing.T) {
	t.Parallel()
	node := datalayer.Topology{Host: "node-1", Rack: "r1", Zone: "z1", Region: "g1"}
	c := schedtest.C{Name: "a", Topology: node, Labels: map[string]string{"disaggregatedset.x-k8s.io/slice": "slice-7", "topology.kubernetes.io/rack": ""}}.Build()

	var nilExt *topology.Extractor
	if got := nilExt.Of(c); got != node {
		t.Errorf("without an extractor: %+v, want the node's %+v", got, node)
	}
	def, err := topology.ExtractorFactory("topology-extractor", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	// An empty label value is no value: the node's rack stays.
	if got := def.(*topology.Extractor).Of(c); got != node {
		t.Errorf("the default labels, absent or empty on the pod: %+v, want the node's %+v", got, node)
	}
	slice, err := topology.ExtractorFactory("slices", json.RawMessage(`{"hostname": "disaggregatedset.x-k8s.io/slice"}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	want := node
	want.Host = "slice-7"
	if got := slice.(*topology.Extractor).Of(c); got != want {
		t.Errorf("hostname from the slice label: %+v, want %+v", got, want)
	}
	if _, err := topology.ExtractorFactory("x", json.RawMessage(`{"host": "a"}`), nil); err == nil {
		t.Error("an unknown parameter was accepted")
	}
}

func TestTopologyProducerNameMustNameAnExtractor(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, text, want string }{
		{"an undefined producer", `
plugins:
- type: topology-affinity-filter
  parameters: {topologyProducerName: slices}
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins: [{pluginRef: topology-affinity-filter}, {pluginRef: max-score-picker}]
`, `topologyProducerName names plugin "slices", which the configuration does not define`},
		{"a producer of another type", `
plugins:
- type: queue-scorer
  name: slices
- type: topology-affinity-scorer
  parameters: {topologyProducerName: slices}
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins: [{pluginRef: topology-affinity-scorer}, {pluginRef: slices}, {pluginRef: max-score-picker}]
`, `topologyProducerName names plugin "slices" of type queue-scorer, which is not a topology-extractor`},
	} {
		_, err := config.NewInTreeRegistry().Load([]byte(tc.text), &config.Handle{Spec: schedtest.NopSpeculator{}})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want %q", tc.name, err, tc.want)
		}
	}
}
