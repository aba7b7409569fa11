package simkit_test

import (
	"bytes"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/pkg/datalayer/scrape"
)

// The EPP's scraper reads an engine's /metrics as it reads vLLM's, and
// what it reads follows the engine.
func TestTheScraperReadsAnEnginesMetricsAsVLLMs(t *testing.T) {
	t.Parallel()
	s := startServer(t)
	for range 2 {
		resp, err := http.Post("http://"+s.Addr()+"/v1/completions", "application/json",
			strings.NewReader(`{"model":"m","prompt":"a b c d e f g h i j","max_tokens":2}`))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
	}
	resp, err := http.Get("http://" + s.Addr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	m, err := scrape.ParseMetrics(page, scrape.DefaultMetricNames)
	if err != nil {
		t.Fatalf("ParseMetrics: %v\n%s", err, page)
	}
	if m.BlockSize != 4 || m.NumGPUBlocks != 512 {
		t.Errorf("cache config = %d-token blocks, %d GPU blocks; want 4 and 512", m.BlockSize, m.NumGPUBlocks)
	}
	if m.WaitingQueueSize != 0 || m.RunningRequests != 0 {
		t.Errorf("idle engine reports %d waiting, %d running", m.WaitingQueueSize, m.RunningRequests)
	}
	// Ten prompt tokens twice; the second time the two full 4-token
	// blocks are hits.
	for _, want := range []string{"vllm:prefix_cache_queries_total{model_name=\"m\"} 20", "vllm:prefix_cache_hits_total{model_name=\"m\"} 8", "vllm:lora_requests_info"} {
		if !bytes.Contains(page, []byte(want)) {
			t.Errorf("metrics page lacks %q", want)
		}
	}
}
