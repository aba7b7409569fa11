package pdsidecar_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/harness/pdsidecar"
	"github.com/kvroute/kvroute/pkg/requestpath/director"
	"github.com/kvroute/kvroute/pkg/requestpath/proxy"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/profile/disagg"
	"github.com/kvroute/kvroute/pkg/sim"
	"github.com/kvroute/kvroute/pkg/testkit"
	"github.com/kvroute/kvroute/pkg/testkit/envoy"
)

// prompt is n token ids from base, as a completion's body.
func prompt(base, n int, stream bool) string {
	ids := make([]int, n)
	for i := range ids {
		ids[i] = base + i
	}
	b, _ := json.Marshal(map[string]any{"model": "m", "prompt": ids, "max_tokens": 4, "stream": stream})
	return string(b)
}

func send(t *testing.T, url, body string) (*http.Response, string) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

func TestThroughTheProxySplitRequestsAreAnsweredByDecodePodsThatKeepTheirPrompts(t *testing.T) {
	t.Parallel()
	w := startWorld(t, worldOptions{prefill: 2, decode: 2})
	base, _ := w.proxy(t, proxy.Options{})
	const n = 4
	first := map[int]string{}
	sent := 0
	for i := range n {
		sent++
		resp, body := send(t, base+"/v1/completions", prompt(1000*(i+1), 96, true))
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, body)
		}
		res, err := sim.ReadStream(strings.NewReader(body), nil)
		if err != nil || res.Text != sim.ReplyText(4) {
			t.Fatalf("request %d: stream %q: %v", i, res.Text, err)
		}
		served := resp.Header.Get(director.HeaderServed)
		if en := w.byAddr(served); en == nil || en.role != sim.RoleDecode {
			t.Fatalf("request %d was answered by %q, not a decode pod", i, served)
		}
		first[i] = served
	}
	testkit.WaitFor(t, "every prefill leg's blocks pulled", func() error {
		pulled := int64(0)
		for _, en := range w.prefill {
			pulled += en.srv.PDStats().Pulled
		}
		if pulled != n {
			return fmt.Errorf("%d holds pulled, want %d", pulled, n)
		}
		return w.nothingHeld()
	})
	remote := int64(0)
	for _, en := range w.decode {
		remote += en.srv.PDStats().RemotePrefills
	}
	if remote != n {
		t.Errorf("decode engines pulled for %d requests, want %d", remote, n)
	}
	// The decode pods published the blocks they received: a repeated
	// prompt goes back to the one that holds it.
	for i := range n {
		testkit.WaitFor(t, "the index holds the prompt on its decode pod", func() error {
			sent++
			resp, body := send(t, base+"/v1/completions", prompt(1000*(i+1), 96, false))
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("repeat %d: %d %s", i, resp.StatusCode, body)
			}
			if got := resp.Header.Get(director.HeaderServed); got != first[i] {
				return fmt.Errorf("repeat %d served by %s; %s holds its prompt", i, got, first[i])
			}
			return nil
		})
	}
	if got := testkit.Value(t, w.epp.Registry(), disagg.DecisionMetric, "decision_type", "prefill-decode"); got != float64(sent) {
		t.Errorf("%s counts %v prefill-decode decisions, want the %d requests", disagg.DecisionMetric, got, sent)
	}
	if got := testkit.Value(t, w.epp.Registry(), disagg.DecisionMetric); got != float64(sent) {
		t.Errorf("%s counts %v decisions in all, want %d", disagg.DecisionMetric, got, sent)
	}
	testkit.WaitFor(t, "every leg accounted on its own pod", func() error {
		if got := testkit.HistCount(t, w.epp.Registry(), "kvroute_pd_prefill_duration_seconds"); got != sent {
			return fmt.Errorf("%d prefill legs measured, want %d", got, sent)
		}
		return w.nothingInFlight()
	})
	// The first requests were streamed: their decode legs' first tokens
	// measured the transfer.
	if got := testkit.HistCount(t, w.epp.Registry(), "kvroute_pd_transfer_duration_seconds"); got < n {
		t.Errorf("%d transfers measured, want at least the %d streamed requests", got, n)
	}
}

func TestThroughTheProxyAFailingPrefillPodFailsItsRequestsLoudly(t *testing.T) {
	t.Parallel()
	w := startWorld(t, worldOptions{prefill: 1, decode: 2, noOutliers: true})
	refusing, refusingReg := w.proxy(t, proxy.Options{})
	decodeOnly, decodeOnlyReg := w.proxy(t, proxy.Options{PrefillFailure: proxy.PrefillFailDecodeOnly})
	if err := w.prefill[0].srv.SetFault(sim.FaultError); err != nil {
		t.Fatal(err)
	}
	const n = 3
	for i := range n {
		resp, body := send(t, refusing+"/v1/completions", prompt(100*i, 40, true))
		if resp.StatusCode != http.StatusBadGateway || !strings.Contains(body, "prefill") {
			t.Fatalf("request %d with its prefill pod failing: %d %s; want a 502 that says the prefill failed", i, resp.StatusCode, body)
		}
		if got := resp.Header.Get(director.HeaderPrefiller); got != w.prefill[0].addr {
			t.Errorf("the failure names prefill pod %q, want %s", got, w.prefill[0].addr)
		}
	}
	for _, en := range w.decode {
		if st := en.srv.Core().Stats(); st.Requests != 0 {
			t.Errorf("decode engine %s served %d requests whose prefill failed; want no decode leg sent", en.addr, st.Requests)
		}
	}
	if got := testkit.Value(t, refusingReg, "kvroute_proxy_pd_prefill_failures_total", "action", "refused"); got != n {
		t.Errorf("refused prefill failures counted %v, want %d", got, n)
	}
	for i := range n {
		resp, body := send(t, decodeOnly+"/v1/completions", prompt(100*i, 40, false))
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("decode-only request %d: %d %s", i, resp.StatusCode, body)
		}
		if en := w.byAddr(resp.Header.Get(director.HeaderServed)); en == nil || en.role != sim.RoleDecode {
			t.Errorf("decode-only request %d served by %q, not a decode pod", i, resp.Header.Get(director.HeaderServed))
		}
	}
	if got := testkit.Value(t, decodeOnlyReg, "kvroute_proxy_pd_prefill_failures_total", "action", "decode_only"); got != n {
		t.Errorf("decode-only prefill failures counted %v, want %d", got, n)
	}
	if err := w.nothingHeld(); err != nil {
		t.Error(err)
	}
}

func TestThroughTheProxyAFailedDecodeLegLeavesNothingHeldOnThePrefillPod(t *testing.T) {
	t.Parallel()
	w := startWorld(t, worldOptions{prefill: 1, decode: 1})
	base, reg := w.proxy(t, proxy.Options{})
	// The decode engine behind its sidecar is down: the sidecar answers
	// 502, and nobody pulls what the prefill pod holds.
	if err := w.decode[0].srv.SetFault(sim.FaultRefuse); err != nil {
		t.Fatal(err)
	}
	resp, body := send(t, base+"/v1/completions", prompt(7, 40, true))
	if resp.StatusCode < 500 {
		t.Fatalf("a request whose decode pod is down: %d %s", resp.StatusCode, body)
	}
	testkit.WaitFor(t, "the prefill pod released the blocks", func() error {
		if st := w.prefill[0].srv.PDStats(); st.Aborted != 1 {
			return fmt.Errorf("prefill engine %+v, want one hold aborted", st)
		}
		return w.nothingHeld()
	})
	if got := testkit.Value(t, reg, "kvroute_proxy_pd_aborts_total", "result", "released"); got != 1 {
		t.Errorf("releases counted %v, want 1", got)
	}
}

func TestThroughTheProxyAClientThatLeavesDuringPrefillStrandsNothing(t *testing.T) {
	t.Parallel()
	// A prefill slow enough (40 tokens at 10ms) for the client to leave during it.
	slow := fastTiming()
	slow.PrefillPerToken = 10 * time.Millisecond
	w := startWorld(t, worldOptions{prefill: 1, decode: 1, prefillTiming: slow})
	base, _ := w.proxy(t, proxy.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/completions", strings.NewReader(prompt(5, 40, true)))
	req.Header.Set("Content-Type", "application/json")
	errc := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	testkit.WaitFor(t, "the prefill engine admitted the prefill leg", func() error {
		if st := w.prefill[0].srv.Core().Stats(); st.Requests != 1 {
			return fmt.Errorf("%d requests admitted", st.Requests)
		}
		return nil
	})
	cancel()
	if err := <-errc; err == nil {
		t.Fatal("a cancelled request succeeded")
	}
	testkit.WaitFor(t, "the prefill engine holds nothing", w.nothingHeld)
	if st := w.decode[0].srv.Core().Stats(); st.Requests != 0 {
		t.Errorf("the decode engine served %d requests; the client left before the decode leg", st.Requests)
	}
}

// viaGateway sends a request as Envoy does: ext_proc picks, and the
// request goes to the pick with the headers ext_proc set.
func viaGateway(t *testing.T, c *envoy.Client, body string) *envoy.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := c.Do(ctx, envoy.Request{Path: "/v1/completions", Body: []byte(body)}, envoy.HTTPUpstream(http.DefaultClient))
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func dialGateway(t *testing.T, w *world) *envoy.Client {
	t.Helper()
	c, err := envoy.Dial(w.epp.ExtProcAddr(), true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestThroughExtProcTheDecodePodsSidecarRunsBothLegs(t *testing.T) {
	t.Parallel()
	w := startWorld(t, worldOptions{prefill: 2, decode: 2})
	c := dialGateway(t, w)
	const n = 4
	first := map[int]string{}
	sent := 0
	for i := range n {
		sent++
		res := viaGateway(t, c, prompt(2000*(i+1), 96, true))
		if res.Status != http.StatusOK || res.Immediate != nil {
			t.Fatalf("request %d: status %d, immediate %v, %s", i, res.Status, res.Immediate, res.ResponseBody)
		}
		en := w.byAddr(res.Destination)
		if en == nil || en.role != sim.RoleDecode {
			t.Fatalf("request %d went to %q, not a decode pod", i, res.Destination)
		}
		if p := w.byAddr(res.SetHeaders[pdsidecar.HeaderPrefiller]); p == nil || p.role != sim.RolePrefill {
			t.Fatalf("request %d names prefill pod %q", i, res.SetHeaders[pdsidecar.HeaderPrefiller])
		}
		if r, err := sim.ReadStream(strings.NewReader(string(res.ResponseBody)), nil); err != nil || r.Text != sim.ReplyText(4) {
			t.Fatalf("request %d: stream %q: %v", i, r.Text, err)
		}
		first[i] = res.Destination
	}
	split := int64(0)
	for _, en := range w.decode {
		split += en.side.Stats().Split
	}
	if split != n {
		t.Errorf("the sidecars split %d requests, want %d", split, n)
	}
	testkit.WaitFor(t, "every prefill leg's blocks pulled", func() error {
		pulled := int64(0)
		for _, en := range w.prefill {
			pulled += en.srv.PDStats().Pulled
		}
		if pulled != n {
			return fmt.Errorf("%d holds pulled, want %d", pulled, n)
		}
		return w.nothingHeld()
	})
	for i := range n {
		testkit.WaitFor(t, "the index holds the prompt on its decode pod", func() error {
			sent++
			res := viaGateway(t, c, prompt(2000*(i+1), 96, false))
			if res.Status != http.StatusOK {
				return fmt.Errorf("repeat %d: %d %s", i, res.Status, res.ResponseBody)
			}
			if res.Destination != first[i] {
				return fmt.Errorf("repeat %d went to %s; %s holds its prompt", i, res.Destination, first[i])
			}
			return nil
		})
	}
	if got := testkit.Value(t, w.epp.Registry(), disagg.DecisionMetric, "decision_type", "prefill-decode"); got != float64(sent) {
		t.Errorf("%s counts %v prefill-decode decisions, want the %d requests", disagg.DecisionMetric, got, sent)
	}
	testkit.WaitFor(t, "the prefill legs the sidecars ran ended with their decode pods' first tokens", w.nothingInFlight)
}

func TestThroughExtProcAFailingPrefillPodFailsItsRequestsLoudly(t *testing.T) {
	t.Parallel()
	w := startWorld(t, worldOptions{prefill: 1, decode: 2, noOutliers: true})
	c := dialGateway(t, w)
	if err := w.prefill[0].srv.SetFault(sim.FaultError); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		res := viaGateway(t, c, prompt(300*i, 40, true))
		if res.Status != http.StatusInternalServerError || !strings.Contains(string(res.ResponseBody), "the engine failed") {
			t.Fatalf("request %d with its prefill pod failing: %d %s; want the prefill pod's failure", i, res.Status, res.ResponseBody)
		}
	}
	for _, en := range w.decode {
		if st := en.srv.Core().Stats(); st.Requests != 0 {
			t.Errorf("decode engine %s served %d requests whose prefill failed", en.addr, st.Requests)
		}
	}
	if err := w.nothingHeld(); err != nil {
		t.Error(err)
	}
}

func TestThroughTheProxyAnEjectedPrefillPodTurnsSplitsIntoCountedDecodeOnlyRequests(t *testing.T) {
	t.Parallel()
	// Outlier detection on: the proxy reports a failed prefill leg against
	// the prefill pod (not the decode pod, whose leg was never sent), so
	// that the prefill pod is ejected and the profile handler's fallback
	// serves the requests decode-only, counted.
	w := startWorld(t, worldOptions{prefill: 1, decode: 2})
	base, _ := w.proxy(t, proxy.Options{})
	if err := w.prefill[0].srv.SetFault(sim.FaultError); err != nil {
		t.Fatal(err)
	}
	failed := 0
	testkit.WaitFor(t, "a request served once the prefill pod is ejected", func() error {
		resp, body := send(t, base+"/v1/completions", prompt(50*failed, 40, false))
		if resp.StatusCode == http.StatusBadGateway && strings.Contains(body, "prefill") {
			failed++
			return fmt.Errorf("request %d failed loudly: %s", failed, body)
		}
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("after %d loud failures: %d %s", failed, resp.StatusCode, body)
		}
		if en := w.byAddr(resp.Header.Get(director.HeaderServed)); en == nil || en.role != sim.RoleDecode {
			t.Fatalf("served by %q, not a decode pod", resp.Header.Get(director.HeaderServed))
		}
		return nil
	})
	if failed == 0 {
		t.Error("no request failed while the prefill pod failed")
	}
	if got := testkit.Value(t, w.epp.Registry(), disagg.FallbackMetric, "stage", "prefill", "fallback", "decode-only"); got < 1 {
		t.Errorf("%s counts %v decode-only fallbacks, want the request served", disagg.FallbackMetric, got)
	}
	for _, en := range w.decode {
		if st := en.srv.PDStats(); st.RemotePrefills != 0 {
			t.Errorf("decode engine %s pulled for %d requests; none had a prefill leg that succeeded", en.addr, st.RemotePrefills)
		}
	}
	if err := w.nothingHeld(); err != nil {
		t.Error(err)
	}
}
