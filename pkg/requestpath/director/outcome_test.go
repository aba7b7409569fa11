package director_test

import (
	"context"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/requestpath/director"
	"github.com/kvroute/kvroute/pkg/requestpath/openai"
)

// pick64 routes a streamed 64-token prompt.
func pick64(t *testing.T, d *director.Director) *director.Pick {
	t.Helper()
	p, err := d.HandleRequest(context.Background(), &director.Input{
		Path: "/v1/completions", Body: []byte(`{"model":"m","prompt":` + jsonIDs(make([]uint32, 64)) + `,"stream":true,"max_tokens":9}`),
	})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestAResponsesOutcomeForOutlierDetection(t *testing.T) {
	t.Parallel()
	d, ds, now := newDirector(t, nil)
	// 64 uncached tokens at a peak of 1000 a second take at least 64ms.
	ds.SetOutlierDetection(datalayer.OutlierDetection{PeakPrefillRate: 1000})
	start := *now
	ok := openai.Usage{PromptTokens: 64, CompletionTokens: 9}
	tests := []struct {
		name string
		s    director.Served
		want datalayer.Outcome
	}{
		{"a refused or broken connection is a connection failure",
			director.Served{Status: 502, ConnFailed: true}, datalayer.OutcomeConnect},
		{"a server error is a 5xx", director.Served{Status: 503}, datalayer.Outcome5xx},
		{"no answer seen (the client left) says nothing", director.Served{}, datalayer.OutcomeNone},
		{"a 4xx is the request's fault", director.Served{Status: 404}, datalayer.OutcomeNone},
		{"a first token sooner than the uncached prompt takes at the peak rate is implausible",
			director.Served{Status: 200, FirstByte: start.Add(5 * time.Millisecond), End: start.Add(6 * time.Millisecond), Usage: ok},
			datalayer.OutcomeImplausible},
		{"with no body seen, an end that soon is implausible too",
			director.Served{Status: 200, End: start.Add(5 * time.Millisecond)}, datalayer.OutcomeImplausible},
		{"a first token after the least prefill time is a success",
			director.Served{Status: 200, FirstByte: start.Add(70 * time.Millisecond), End: start.Add(80 * time.Millisecond), Usage: ok},
			datalayer.OutcomeSuccess},
		{"tokens the engine says it found cached need no prefill time",
			director.Served{Status: 200, FirstByte: start.Add(2 * time.Millisecond), Usage: openai.Usage{PromptTokens: 64, CachedTokens: 63, CompletionTokens: 1}},
			datalayer.OutcomeSuccess},
		{"but the tokens it says it computed do",
			director.Served{Status: 200, FirstByte: start.Add(2 * time.Millisecond), Usage: openai.Usage{PromptTokens: 64, CachedTokens: 60, CompletionTokens: 1}},
			datalayer.OutcomeImplausible},
		{"a whole prompt cached is never too fast",
			director.Served{Status: 200, FirstByte: start.Add(time.Millisecond), Usage: openai.Usage{PromptTokens: 64, CachedTokens: 64, CompletionTokens: 1}},
			datalayer.OutcomeSuccess},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := pick64(t, d)
			if got := d.Outcome(p, tt.s); got != tt.want {
				t.Errorf("Outcome = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestAFastAnswerIsPlausibleWithOutlierDetectionOff(t *testing.T) {
	t.Parallel()
	d, _, now := newDirector(t, nil)
	p := pick64(t, d)
	if got := d.Outcome(p, director.Served{Status: 200, FirstByte: now.Add(time.Nanosecond)}); got != datalayer.OutcomeSuccess {
		t.Fatalf("Outcome = %v, want success", got)
	}
}

func TestFailedResponsesTeachNothingAndEjectTheirEndpoint(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		status int
		served func(start time.Time) director.Served
	}{
		{"answered at once with a 500", 500, func(start time.Time) director.Served {
			return director.Served{Status: 500, FirstByte: start.Add(time.Millisecond), End: start.Add(time.Millisecond)}
		}},
		{"answered at once with a made-up 200", 200, func(start time.Time) director.Served {
			return director.Served{Status: 200, Streamed: true, FirstByte: start.Add(time.Microsecond), End: start.Add(2 * time.Microsecond),
				Usage: openai.Usage{PromptTokens: 64, CompletionTokens: 9}}
		}},
		{"whose connection was refused", 0, func(time.Time) director.Served {
			return director.Served{Status: 502, ConnFailed: true}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rec := &recorder{}
			d, ds, now := newDirector(t, nil, rec)
			ds.SetOutlierDetection(datalayer.OutlierDetection{Consecutive5xx: 3, PeakPrefillRate: 1000, Now: func() time.Time { return *now }})
			var addr, name string
			for range 3 {
				p := pick64(t, d)
				if addr == "" {
					addr, name = p.Targets[0], p.Result.Targets()[0].Name
				}
				if p.Targets[0] != addr {
					// The random picker chose the other endpoint: its
					// success would not break this one's run.
					d.HandleResponse(p, director.Served{Status: 200, FirstByte: now.Add(time.Second), End: now.Add(time.Second)})
					continue
				}
				s := tc.served(*now)
				s.Endpoint = addr
				if tc.status != 0 {
					d.HandleHeaders(p, tc.status)
					d.HandleFirstByte(p)
					d.HandleProgress(p, 1)
				}
				d.HandleResponse(p, s)
			}
			for range 20 {
				if ds.Ejected(addr) {
					break
				}
				p := pick64(t, d)
				if p.Targets[0] != addr {
					d.HandleResponse(p, director.Served{})
					continue
				}
				if tc.status != 0 {
					d.HandleHeaders(p, tc.status)
					d.HandleFirstByte(p)
				}
				s := tc.served(*now)
				s.Endpoint = addr
				d.HandleResponse(p, s)
			}
			if !ds.Ejected(addr) {
				t.Fatalf("%s not ejected after its failures", addr)
			}
			rec.mu.Lock()
			defer rec.mu.Unlock()
			for _, r := range rec.seen {
				if r.Endpoint == addr {
					t.Fatalf("the plugin observers (the latency predictor) heard a failed response: %+v", r)
				}
			}
			if f := ds.InFlight(name); f.RecentEnds != 0 || f.Ended[0] != 0 || f.Requests() != 0 {
				t.Fatalf("the in-flight accounting learned from failed responses: recent ends %v, ended %v, in flight %d",
					f.RecentEnds, f.Ended, f.Requests())
			}
			for range 10 {
				if p := pick64(t, d); p.Targets[0] == addr {
					t.Fatalf("the ejected %s was picked", addr)
				}
			}
		})
	}
}
