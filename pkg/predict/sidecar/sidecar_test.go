package sidecar

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/predict"
	"github.com/kvroute/kvroute/pkg/testkit"
)

// fakeSidecar serves the sidecar's published request and response shapes
// on loopback, checking each request as its pydantic models would, and
// predicting by a fixed linear rule so that answers can be checked.
type fakeSidecar struct {
	mu      sync.Mutex
	entries []map[string]any
	status  int // when set, answered instead
}

func (f *fakeSidecar) handler(t *testing.T) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+PathPredictBulkStrict, func(w http.ResponseWriter, r *http.Request) {
		if f.status != 0 {
			http.Error(w, `{"detail":"Models not ready"}`, f.status)
			return
		}
		var body struct {
			Requests []map[string]any `json:"requests"`
		}
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil || len(body.Requests) < 1 || len(body.Requests) > MaxBulk {
			http.Error(w, `{"detail":"validation error"}`, http.StatusUnprocessableEntity)
			return
		}
		var preds []map[string]any
		for _, req := range body.Requests {
			if msg := validFeatures(req); msg != "" {
				http.Error(w, `{"detail":"`+msg+`"}`, http.StatusUnprocessableEntity)
				return
			}
			in, score := req["input_token_length"].(float64), req["prefix_cache_score"].(float64)
			preds = append(preds, map[string]any{
				"ttft_ms": 10 + (1-score)*in*0.05 + 20*req["num_request_waiting"].(float64),
				"tpot_ms": 8 + req["num_request_running"].(float64), "predicted_at": time.Now(),
				"model_type": "xgboost", "objective_type": "quantile", "quantile": 0.95, "last_model_load": nil,
			})
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"predictions": preds, "total_requests": len(preds),
			"successful_predictions": len(preds), "failed_predictions": 0, "processing_time_ms": 0.1})
	})
	mux.HandleFunc("POST "+PathAddTrainingBulk, func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			Entries []map[string]any `json:"entries"`
		}
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			http.Error(w, `{"detail":"validation error"}`, http.StatusUnprocessableEntity)
			return
		}
		for _, e := range body.Entries {
			if msg := validFeatures(e); msg != "" {
				http.Error(w, `{"detail":"`+msg+`"}`, http.StatusUnprocessableEntity)
				return
			}
			for _, k := range []string{"actual_ttft_ms", "actual_tpot_ms"} {
				if v, ok := e[k].(float64); !ok || v < 0 {
					http.Error(w, `{"detail":"`+k+`"}`, http.StatusUnprocessableEntity)
					return
				}
			}
		}
		f.mu.Lock()
		f.entries = append(f.entries, body.Entries...)
		f.mu.Unlock()
		w.WriteHeader(http.StatusAccepted)
		_ = json.NewEncoder(w).Encode(map[string]string{"message": fmt.Sprintf("Accepted %d training samples.", len(body.Entries))})
	})
	return mux
}

// validFeatures checks one request's features as the sidecar's
// PredictionRequest model does; it returns what is wrong.
func validFeatures(m map[string]any) string {
	for _, k := range []string{"input_token_length", "num_request_waiting", "num_request_running", "num_tokens_generated",
		"prefill_tokens_in_flight", "decode_tokens_in_flight"} {
		v, ok := m[k].(float64)
		if !ok || v < 0 || v != float64(int64(v)) {
			return k + " must be an integer ≥ 0"
		}
	}
	for _, k := range []string{"kv_cache_percentage", "prefix_cache_score"} {
		v, ok := m[k].(float64)
		if !ok || v < 0 || v > 1 {
			return k + " must be in [0,1]"
		}
	}
	if _, ok := m["pod_type"].(string); !ok {
		return "pod_type must be a string"
	}
	return ""
}

func start(t *testing.T, f *fakeSidecar, o Options) *Client {
	t.Helper()
	srv := httptest.NewServer(f.handler(t))
	t.Cleanup(srv.Close)
	o.PredictionURL, o.TrainingURL = srv.URL, srv.URL+"/"
	if o.Timeout == 0 {
		o.Timeout = 5 * time.Second
	}
	c, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestPredictionsComeFromTheSidecarInOrder(t *testing.T) {
	t.Parallel()
	c := start(t, &fakeSidecar{}, Options{})
	ins := []predict.Input{
		{InputTokens: 1000, GPUTokens: 750, Waiting: 1, Running: 3, KVUsage: 0.5},
		{InputTokens: 1000, MetricsStale: true, Waiting: 9, KVUsage: 3},
		{InputTokens: -5, GPUTokens: 10, PrefillTokens: -1},
	}
	out := make([]predict.Prediction, len(ins))
	if err := c.PredictAll(context.Background(), []string{"a", "b", "c"}, ins, out); err != nil {
		t.Fatal(err)
	}
	// 10 + (1-0.75)·1000·0.05 + 20·1 = 42.5; stale metrics are sent as none.
	if out[0].TTFT != 42.5 || out[0].TTFTQuantile != 42.5 || out[0].TPOT != 11 {
		t.Errorf("first: %+v, want TTFT 42.5ms and TPOT 11ms", out[0])
	}
	if out[1].TTFT != 60 || out[1].TPOT != 8 {
		t.Errorf("stale metrics: %+v, want TTFT 60ms (no queue sent) and TPOT 8ms", out[1])
	}
	if c.Quantile() != 0.95 {
		t.Errorf("quantile = %v, want the sidecar's 0.95", c.Quantile())
	}
}

func TestAFailingSidecarIsAnError(t *testing.T) {
	t.Parallel()
	f := &fakeSidecar{status: http.StatusServiceUnavailable}
	c := start(t, f, Options{})
	out := make([]predict.Prediction, 1)
	err := c.PredictAll(context.Background(), nil, []predict.Input{{InputTokens: 10}}, out)
	if !errors.Is(err, ErrBadResponse) {
		t.Errorf("err = %v, want ErrBadResponse", err)
	}
	unreachable, err := New(Options{PredictionURL: "http://127.0.0.1:1", TrainingURL: "http://127.0.0.1:1", Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := unreachable.PredictAll(context.Background(), nil, []predict.Input{{}}, out); err == nil {
		t.Error("an unreachable sidecar answered")
	}
	for _, o := range []Options{{}, {PredictionURL: "localhost:8001", TrainingURL: "http://x"}} {
		if _, err := New(o); err == nil {
			t.Errorf("New(%+v) accepted", o)
		}
	}
}

func TestTrainingSamplesAreBatchedToTheSidecar(t *testing.T) {
	t.Parallel()
	f := &fakeSidecar{}
	c := start(t, f, Options{FlushBatch: 3, FlushInterval: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	observe := func(i int) {
		c.Observe(predict.Sample{Endpoint: "a", Input: predict.Input{InputTokens: 100 * (i + 1), GPUTokens: 50},
			TTFTMs: float64(20 + i), HasTTFT: true, TPOTMs: 9, HasTPOT: i%2 == 0, OutputTokens: 32})
	}
	for i := range 3 {
		observe(i)
	}
	// The third filled a batch: it is sent without waiting for the tick.
	testkit.WaitFor(t, "a full batch to reach the sidecar", func() error {
		f.mu.Lock()
		defer f.mu.Unlock()
		if seen := len(f.entries); seen != 3 {
			return fmt.Errorf("len(f.entries) is %v, want %v", seen, 3)
		}
		return nil
	})
	observe(3)
	cancel() // the fourth goes with the last flush
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.entries) != 4 {
		t.Fatalf("the sidecar got %d samples, want 4", len(f.entries))
	}
	e := f.entries[1]
	if e["actual_ttft_ms"] != 21.0 || e["actual_tpot_ms"] != 0.0 || e["num_tokens_generated"] != 32.0 || e["input_token_length"] != 200.0 || e["prefix_cache_score"] != 0.25 {
		t.Errorf("second sample: %v", e)
	}
}

func FuzzDecodePredictions(f *testing.F) {
	f.Add([]byte(`{"predictions":[{"ttft_ms":12.5,"tpot_ms":8,"quantile":0.9}]}`), 1)
	f.Add([]byte(`{"predictions":[{"ttft_ms":-1,"tpot_ms":8}]}`), 1)
	f.Add([]byte(`{"predictions":[{"ttft_ms":1e400,"tpot_ms":8}]}`), 1)
	f.Add([]byte(`{"predictions":null}`), 0)
	f.Fuzz(func(t *testing.T, raw []byte, n int) {
		if n < 0 || n > 64 {
			return
		}
		out := make([]predict.Prediction, n)
		if _, err := decodePredictions(raw, out); err != nil {
			return
		}
		for _, p := range out {
			if !(p.TTFT >= 0) || !(p.TPOT >= 0) {
				t.Fatalf("accepted %s into %+v", raw, out)
			}
		}
	})
}
