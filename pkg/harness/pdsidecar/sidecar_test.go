package pdsidecar_test

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/harness/pdsidecar"
	"github.com/kvroute/kvroute/pkg/sim"
	"github.com/kvroute/kvroute/pkg/sim/blockpool"
)

// startEngine runs one simulated engine of role on loopback.
func startEngine(t testing.TB, pod, role string) *sim.Server {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	eng := sim.NewEngine(sim.EngineConfig{Pod: pod, Address: ln.Addr().String(), Model: "m", Role: role,
		Transfer: sim.Transfer{HoldTimeout: time.Hour},
		Pool:     blockpool.Config{BlockSize: 4, GPUBlocks: 512, Seed: 1}}, nil)
	s := sim.NewServer(sim.NewCore(eng, fastTiming()), ln)
	run(t, s.Core().Run)
	run(t, s.Run)
	return s
}

// run runs f until the test ends.
func run(t testing.TB, f func(context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
}

func startSidecar(t testing.TB, decoder string) *pdsidecar.Sidecar {
	t.Helper()
	s, err := pdsidecar.New("127.0.0.1:0", decoder)
	if err != nil {
		t.Fatal(err)
	}
	run(t, s.Run)
	return s
}

func sidecarPost(t *testing.T, s *pdsidecar.Sidecar, path, prefiller, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, "http://"+s.Addr()+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if prefiller != "" {
		req.Header.Set(pdsidecar.HeaderPrefiller, prefiller)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	_, _ = b.ReadFrom(resp.Body)
	return resp.StatusCode, b.String()
}

func TestTheSidecarRunsThePrefillLegOnThePodItsHeaderNames(t *testing.T) {
	t.Parallel()
	p := startEngine(t, "p", sim.RolePrefill)
	d := startEngine(t, "d", sim.RoleDecode)
	s := startSidecar(t, d.Addr())
	long := strings.Repeat("alpha beta gamma delta ", 6)
	tests := []struct {
		name, path, prefiller, body string
		split                       bool
	}{
		{"a completion naming a prefill pod is split", "/v1/completions", p.Addr(),
			`{"model":"m","prompt":"` + long + `one","max_tokens":3,"stream":true,"stream_options":{"include_usage":true}}`, true},
		{"a chat naming a prefill pod is split", "/v1/chat/completions", p.Addr(),
			`{"model":"m","messages":[{"role":"user","content":"` + long + `two"}],"max_completion_tokens":3,"stream":true}`, true},
		{"a request naming none is served locally", "/v1/completions", "",
			`{"model":"m","prompt":"` + long + `three","max_tokens":3,"stream":true}`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before, pulled := d.PDStats().RemotePrefills, p.PDStats().Pulled
			code, body := sidecarPost(t, s, tt.path, tt.prefiller, tt.body)
			if code != http.StatusOK {
				t.Fatalf("status %d: %s", code, body)
			}
			res, err := sim.ReadStream(strings.NewReader(body), nil)
			if err != nil || len(strings.Fields(res.Text)) != 3 {
				t.Fatalf("stream %q: %v", res.Text, err)
			}
			split := d.PDStats().RemotePrefills == before+1 && p.PDStats().Pulled == pulled+1
			if split != tt.split {
				t.Errorf("split %v, want %v (decode %+v, prefill %+v)", split, tt.split, d.PDStats(), p.PDStats())
			}
		})
	}
	// A scrape of the engine's metrics passes through and is no request.
	resp, err := http.Get("http://" + s.Addr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("metrics through the sidecar: status %d", resp.StatusCode)
	}
	if st := s.Stats(); st.Split != 2 || st.Local != 1 {
		t.Errorf("sidecar stats %+v, want 2 split and 1 local (the metrics scrape not counted)", st)
	}
	if st := p.PDStats(); st.Held != 0 {
		t.Errorf("the prefill engine still holds %d transfers", st.Held)
	}
}

func TestTheSidecarAnswersAFailedPrefillWithItsFailureAndSendsNoDecode(t *testing.T) {
	t.Parallel()
	p := startEngine(t, "p", sim.RolePrefill)
	d := startEngine(t, "d", sim.RoleDecode)
	s := startSidecar(t, d.Addr())
	if err := p.SetFault(sim.FaultError); err != nil {
		t.Fatal(err)
	}
	code, body := sidecarPost(t, s, "/v1/completions", p.Addr(), `{"model":"m","prompt":"a b c d e f","max_tokens":2}`)
	if code != http.StatusInternalServerError || !strings.Contains(body, "the engine failed") {
		t.Errorf("a failed prefill: %d %s; want the prefill pod's 500", code, body)
	}
	if code, body := sidecarPost(t, s, "/v1/completions", closedAddr(t), `{"model":"m","prompt":"a b c d e f","max_tokens":2}`); code != http.StatusBadGateway {
		t.Errorf("an unreachable prefill pod: %d %s; want 502", code, body)
	}
	if st := d.Core().Stats(); st.Requests != 0 {
		t.Errorf("the decode engine served %d requests, want none", st.Requests)
	}
	if st := s.Stats(); st.PrefillFailures != 2 {
		t.Errorf("sidecar stats %+v, want 2 prefill failures", st)
	}
}

// closedAddr is a loopback address nothing listens on.
func closedAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// FuzzSidecarRequest sends arbitrary bodies naming a prefill pod that
// refuses connections: each gets a clear client or gateway error, never a
// panic.
func FuzzSidecarRequest(f *testing.F) {
	for _, s := range []string{`{"model":"m","prompt":"a"}`, `[]`, `null`, `{"stream_options":1}`, `{`} {
		f.Add([]byte(s))
	}
	s := startSidecar(f, closedAddr(f))
	gone := closedAddr(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		req, _ := http.NewRequest(http.MethodPost, "http://"+s.Addr()+"/v1/completions", bytes.NewReader(body))
		req.Header.Set(pdsidecar.HeaderPrefiller, gone)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest && resp.StatusCode != http.StatusBadGateway {
			t.Errorf("%q: status %d", body, resp.StatusCode)
		}
	})
}
