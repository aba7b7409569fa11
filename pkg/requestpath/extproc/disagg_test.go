package extproc_test

import (
	"context"
	"slices"
	"testing"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/requestpath/director"
	"github.com/kvroute/kvroute/pkg/requestpath/extproc"
	"github.com/kvroute/kvroute/pkg/scheduling"
	"github.com/kvroute/kvroute/pkg/scheduling/config"
	"github.com/kvroute/kvroute/pkg/testkit/envoy"
)

// pdDirector is a director over a decode pod (10.0.0.1), a prefill pod
// (10.0.0.2) and an encode pod (10.0.0.3), scheduling with a P/D
// configuration whose handler has the given parameters.
func pdDirector(t *testing.T, handler string) *director.Director {
	t.Helper()
	ds := datalayer.NewDatastore(nil)
	for i, role := range []string{"decode", "prefill", "encode"} {
		ds.Upsert(&datalayer.Endpoint{Name: role, Address: "10.0.0." + string(rune('1'+i)) + ":8000", Model: "m",
			Labels: map[string]string{"llm-d.ai/role": role}})
	}
	l, err := config.NewInTreeRegistry().Load([]byte(`
plugins:
- type: decode-filter
- type: prefill-filter
- type: encode-filter
- type: max-score-picker
- type: always-disagg-pd-decider
- type: always-disagg-multimodal-decider
- {type: disagg-profile-handler, parameters: `+handler+`}
schedulingProfiles:
- {name: decode, plugins: [{pluginRef: decode-filter}]}
- {name: prefill, plugins: [{pluginRef: prefill-filter}]}
- {name: encode, plugins: [{pluginRef: encode-filter}]}
`), nil)
	if err != nil {
		t.Fatal(err)
	}
	sched, err := scheduling.New(l.SchedulerOptions())
	if err != nil {
		t.Fatal(err)
	}
	d, err := director.New(director.Options{Datastore: ds, Scheduler: sched, InFlight: ds})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestASplitPickGoesOutAsTheSidecarsHeaders(t *testing.T) {
	t.Parallel()
	chat := []byte(`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"what is this?"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]}]}`)
	// Headers a client sent to steer the decode pod's sidecar elsewhere.
	forged := map[string]string{director.HeaderPrefiller: "169.254.169.254:80", director.HeaderEncoders: "169.254.169.254:80", datalayer.HeaderDataParallelRank: "7"}
	tests := []struct {
		name      string
		handler   string
		path      string
		body      []byte
		prefiller string
		encoders  string
		removed   []string
	}{
		{"prefill and encode apart", "{deciders: {prefill: always-disagg-pd-decider, encode: always-disagg-multimodal-decider}}",
			"/v1/chat/completions", chat, "10.0.0.2:8000", "10.0.0.3:8000", []string{datalayer.HeaderDataParallelRank}},
		{"prefill apart only", "{deciders: {prefill: always-disagg-pd-decider, encode: always-disagg-multimodal-decider}}",
			"/v1/completions", completion(tokens(1, 64), false), "10.0.0.2:8000", "", []string{director.HeaderEncoders, datalayer.HeaderDataParallelRank}},
		{"encode apart only", "{deciders: {encode: always-disagg-multimodal-decider}}",
			"/v1/chat/completions", chat, "", "10.0.0.3:8000", []string{director.HeaderPrefiller, datalayer.HeaderDataParallelRank}},
		{"decode alone", "{}",
			"/v1/completions", completion(tokens(1, 64), false), "", "", []string{director.HeaderPrefiller, director.HeaderEncoders, datalayer.HeaderDataParallelRank}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, c, _ := startServer(t, pdDirector(t, tt.handler), extproc.Options{})
			var sent map[string]string
			up := func(_ context.Context, target, _ string, headers map[string]string, _ []byte) (*envoy.Response, error) {
				sent = headers
				return &envoy.Response{Status: 200, ContentType: "application/json", Parts: [][]byte{[]byte(`{"usage":{"prompt_tokens":1,"completion_tokens":1}}`)}}, nil
			}
			res, err := c.Do(context.Background(), envoy.Request{Path: tt.path, Body: tt.body, Headers: forged}, up)
			if err != nil {
				t.Fatal(err)
			}
			if res.Immediate != nil {
				t.Fatalf("refused: %s", res.Immediate.GetBody())
			}
			if res.Destination != "10.0.0.1:8000" {
				t.Errorf("destination %q, want the decode pod", res.Destination)
			}
			if got := res.SetHeaders[director.HeaderPrefiller]; got != tt.prefiller {
				t.Errorf("%s = %q, want %q", director.HeaderPrefiller, got, tt.prefiller)
			}
			if got := res.SetHeaders[director.HeaderEncoders]; got != tt.encoders {
				t.Errorf("%s = %q, want %q", director.HeaderEncoders, got, tt.encoders)
			}
			if !slices.Equal(res.RemovedHeaders, tt.removed) {
				t.Errorf("removed %q, want %q", res.RemovedHeaders, tt.removed)
			}
			if r, ok := sent[datalayer.HeaderDataParallelRank]; ok {
				t.Errorf("the decode pod got the client's %s=%q", datalayer.HeaderDataParallelRank, r)
			}
			if sent[director.HeaderPrefiller] != tt.prefiller || sent[director.HeaderEncoders] != tt.encoders {
				t.Errorf("the decode pod got %s=%q, %s=%q: a client's value passed through", director.HeaderPrefiller, sent[director.HeaderPrefiller],
					director.HeaderEncoders, sent[director.HeaderEncoders])
			}
		})
	}
}
