package selfcheck_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/epp"
	"github.com/kvroute/kvroute/pkg/requestpath/selfcheck"
	"github.com/kvroute/kvroute/pkg/sim"
	"github.com/kvroute/kvroute/pkg/testkit"
	"github.com/kvroute/kvroute/pkg/testkit/fleet"
)

// words turns token ids into the stand-ins' words, so that a text prompt
// tokenizes back to distinct ids.
func words(ids []uint32) string {
	var b strings.Builder
	for i, id := range ids {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "w%d", id)
	}
	return b.String()
}

// run sends n text completions through the EPP's proxy, cycling over
// prompts, and returns the EPP.
func run(t *testing.T, o fleet.Options, prompts []string, n int) (*fleet.Fleet, *testkit.LogBuffer) {
	t.Helper()
	log := &testkit.LogBuffer{}
	adjust := o.EPP
	o.EPP = func(eo *epp.Options) {
		eo.RequestPath.ProxyAddr = "127.0.0.1:0"
		eo.Logger = slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelWarn}))
		eo.SelfCheck = selfcheck.Options{Window: 16, MinSamples: 8, FleetWindow: 64, FleetMinTokens: 512, Cooldown: time.Hour}
		// A lone EPP has nothing to share: the alarms are tested without
		// the sharing's readiness wait.
		eo.Share.Disabled = true
		if adjust != nil {
			adjust(eo)
		}
	}
	f := fleet.Start(t, o)
	testkit.WaitFor(t, "the EPP to be ready", func() error {
		if !f.EPP.Ready() {
			return errors.New("f.EPP.Ready() is false")
		}
		return nil
	})
	url := "http://" + f.EPP.ProxyAddr() + "/v1/completions"
	for i := range n {
		body, _ := json.Marshal(map[string]any{"model": "m", "prompt": prompts[i%len(prompts)], "max_tokens": 1})
		resp, err := http.Post(url, "application/json", strings.NewReader(string(body)))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: status %d", i, resp.StatusCode)
		}
	}
	return f, log
}

func sharedPrefixPrompts(seed uint64) []string {
	var out []string
	for _, p := range (sim.SharedPrefix{Groups: 6, PromptsPerGroup: 4, SystemTokens: 24, QuestionTokens: 12, Seed: seed}).Prompts() {
		out = append(out, words(p.Tokens))
	}
	return out
}

func TestEnginesThatAgreeWithTheIndexRaiseNothingOverALongRun(t *testing.T) {
	t.Parallel()
	f, log := run(t, fleet.Options{Endpoints: 3}, sharedPrefixPrompts(1), 400)
	checked := 0.0
	for _, r := range []string{selfcheck.ResultAgree, selfcheck.ResultOver, selfcheck.ResultUnder} {
		checked += testkit.Value(t, f.Metrics, "kvroute_selfcheck_responses_total", "result", r)
	}
	agree := testkit.Value(t, f.Metrics, "kvroute_selfcheck_responses_total", "result", selfcheck.ResultAgree)
	t.Logf("%v of %v checked responses agree", agree, checked)
	if checked < 300 || agree < 0.95*checked {
		t.Fatalf("%v of %v checked responses agree; want 300 checked at least, 95%% agreeing", agree, checked)
	}
	if n := testkit.Value(t, f.Metrics, "kvroute_selfcheck_distrusts_total"); n != 0 {
		t.Errorf("%v endpoints distrusted", n)
	}
	if n := testkit.Value(t, f.Metrics, "kvroute_selfcheck_alarm"); n != 0 {
		t.Errorf("alarm raised: %v", n)
	}
	if strings.Contains(log.String(), "cached") {
		t.Errorf("the self-check logged:\n%s", log.String())
	}
	if got := testkit.Value(t, f.Metrics, "kvroute_selfcheck_cached_tokens_total"); got == 0 {
		t.Fatal("no engine found anything cached: the test proves nothing")
	}
}

func TestATokenizerThatDisagreesWithTheEnginesRaisesTheAlarmAndResyncs(t *testing.T) {
	t.Parallel()
	// Another vocabulary: every id one off the engines'. The index's keys
	// for a request then never meet the engines' blocks.
	shifted := func(text string) []uint32 {
		ids := fleet.TokenizeText(text)
		for i := range ids {
			ids[i]++
		}
		return ids
	}
	f, log := run(t, fleet.Options{Endpoints: 3, Tokenize: shifted, EPP: func(eo *epp.Options) {
		// Without speculation, nothing but the (wrong) keys predicts.
		eo.Index.SpeculativeTTL = time.Millisecond
	}}, sharedPrefixPrompts(2), 200)
	if !f.EPP.SelfCheck().Alarm(selfcheck.AlarmBlind) {
		t.Fatalf("no blind alarm; log:\n%s", log.String())
	}
	if !strings.Contains(log.String(), "the prefix index never predicted") || !strings.Contains(log.String(), "tokenizer") {
		t.Errorf("the alarm's log line does not say what to check:\n%s", log.String())
	}
	if n := testkit.Value(t, f.Metrics, "kvroute_selfcheck_distrusts_total"); n == 0 {
		t.Error("no endpoint was distrusted")
	}
	if n := testkit.Value(t, f.Metrics, "kvroute_recovery_distrusted_total"); n == 0 {
		t.Fatal("recovery distrusted no stream")
	}
	// The streams were never at fault: resynchronised, they are exact again.
	testkit.WaitFor(t, "the distrusted streams to be resynchronised", func() error {
		for _, s := range f.Servers {
			if st, _ := f.EPP.Index().State(s.Addr); st.String() != "exact" {
				return fmt.Errorf("%s is %s", s.Addr, st)
			}
		}
		return nil
	})
}

func TestATokenizerThatCollapsesPromptsRaisesAnOverclaim(t *testing.T) {
	t.Parallel()
	// Every word is the same unknown token: different prompts of one
	// length look alike to the EPP, and its speculation promises what no
	// engine holds.
	unknown := func(text string) []uint32 { return make([]uint32, len(strings.Fields(text))) }
	var prompts []string
	for i := range 64 {
		ids := make([]uint32, 40)
		for j := range ids {
			ids[j] = uint32(1000*i + j)
		}
		prompts = append(prompts, words(ids))
	}
	f, log := run(t, fleet.Options{Endpoints: 3, Tokenize: unknown}, prompts, 64)
	if !f.EPP.SelfCheck().Alarm(selfcheck.AlarmOverclaim) {
		t.Fatalf("no overclaim alarm; log:\n%s", log.String())
	}
	if !strings.Contains(log.String(), "far fewer cached prompt tokens than the prefix index predicted") {
		t.Errorf("the alarm's log line does not say what it saw:\n%s", log.String())
	}
}
