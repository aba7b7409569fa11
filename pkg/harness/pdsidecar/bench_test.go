package pdsidecar_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/sim"
)

// BenchmarkSplitRequest is a split request through the EPP's proxy (pick,
// prefill leg, decode leg) against, in the same run on engines whose steps
// and transfers cost nothing, the same two legs sent by the client itself
// straight to the engines, and one unsplit request straight to the decode
// engine: what the proxy adds to the legs' own cost. It reports each
// path's time per request and the ratios.
func BenchmarkSplitRequest(b *testing.B) {
	w := startWorld(b, worldOptions{prefill: 1, decode: 1, timing: sim.Timing{MaxSeqs: 64}, transfer: &sim.Transfer{HoldTimeout: time.Minute}})
	base, _ := w.proxy(b, proxyOptions())
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	post := func(url, body string) []byte {
		resp, err := client.Post(url, "application/json", strings.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		out, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b.Fatalf("status %d: %s", resp.StatusCode, out)
		}
		return out
	}
	prefillURL := "http://" + w.prefill[0].srv.Addr() + "/v1/completions"
	decodeURL := "http://" + w.decode[0].srv.Addr() + "/v1/completions"
	// The decode pod's address in the pool is its sidecar's, which passes
	// a request naming no prefill pod through: the proxy's decode leg
	// takes that hop, and so do the client's.
	decodePodURL := "http://" + w.decode[0].addr + "/v1/completions"
	legs := func(body string) {
		var fields map[string]json.RawMessage
		_ = json.Unmarshal([]byte(body), &fields)
		leg := map[string]json.RawMessage{}
		for k, v := range fields {
			leg[k] = v
		}
		leg["kv_transfer_params"] = json.RawMessage(`{"do_remote_decode":true}`)
		leg["max_tokens"], leg["stream"] = json.RawMessage("1"), json.RawMessage("false")
		pb, _ := json.Marshal(leg)
		var out struct {
			KV json.RawMessage `json:"kv_transfer_params"`
		}
		if err := json.Unmarshal(post(prefillURL, string(pb)), &out); err != nil || len(out.KV) == 0 {
			b.Fatalf("prefill answer without kv_transfer_params: %v", err)
		}
		fields["kv_transfer_params"] = out.KV
		db, _ := json.Marshal(fields)
		post(decodePodURL, string(bytes.TrimSpace(db)))
	}
	var split, twoLegs, alone time.Duration
	i := 0
	for b.Loop() {
		// New 256-token prompts each time: every split pulls 16 blocks.
		t0 := time.Now()
		post(base+"/v1/completions", prompt(1_000_000+i*900, 256, true))
		t1 := time.Now()
		legs(prompt(1_000_300+i*900, 256, true))
		t2 := time.Now()
		post(decodeURL, prompt(1_000_600+i*900, 256, true))
		split, twoLegs, alone = split+t1.Sub(t0), twoLegs+t2.Sub(t1), alone+time.Since(t2)
		i++
	}
	n := float64(i)
	b.ReportMetric(float64(split.Nanoseconds())/n, "proxy-split-ns/req")
	b.ReportMetric(float64(twoLegs.Nanoseconds())/n, "client-legs-ns/req")
	b.ReportMetric(float64(alone.Nanoseconds())/n, "unsplit-ns/req")
	b.ReportMetric(float64(split)/float64(twoLegs), "proxy-split/client-legs")
	b.ReportMetric(float64(twoLegs)/float64(alone), "client-legs/unsplit")
}
