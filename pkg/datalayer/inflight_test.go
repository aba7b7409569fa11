package datalayer

import (
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/enginesched"
)

// inFlightNow is f without the replay's counts and the step under way
// (checked below, and in package enginesched) and the recent prefill
// work, which outlasts the requests: what is in flight now.
func inFlightNow(f InFlight) InFlight {
	f.Ahead, f.ReplayedAt = enginesched.Ahead{}, 0
	f.RecentPrefill, f.RecentPrefillAt = 0, 0
	f.RecentEnds, f.RecentEndsAt = 0, 0
	f.Ended = [EndedKept]int64{}
	f.StepStart = 0
	return f
}

func TestInFlightFollowsARequestFromPickToEnd(t *testing.T) {
	t.Parallel()
	ds := NewDatastore(nil)
	ds.Upsert(ep("a", "10.0.0.1:8000"))
	d1 := ds.Dispatch("a", time.Unix(1, 0), 300, 1000, 0)
	d2 := ds.Dispatch("a", time.Unix(2, 0), 50, 2000, 0)
	if got := inFlightNow(ds.InFlight("a")); got != (InFlight{Prefilling: 2, PrefillTokens: 350, OldestPrefill: time.Unix(1, 0).UnixNano()}) {
		t.Fatalf("after two dispatches: %+v", got)
	}
	d1.FirstToken(time.Unix(5, 0))
	d1.FirstToken(time.Unix(6, 0)) // a second first byte changes nothing
	if got := inFlightNow(ds.InFlight("a")); got != (InFlight{Prefilling: 1, PrefillTokens: 50, Decoding: 1, DecodeTokens: 1000, OldestPrefill: time.Unix(2, 0).UnixNano()}) {
		t.Fatalf("after the first's first token: %+v", got)
	}
	if c := ds.Candidates(nil)[0]; c.InFlight.Requests() != 2 || c.InFlight.DecodeTokens != 1000 {
		t.Errorf("the candidate's snapshot is %+v", c.InFlight)
	}
	d1.Done()
	d2.Done() // ended before its first token: a refused or cut response
	d2.Done()
	d2.FirstToken(time.Unix(7, 0)) // too late to count
	if got := inFlightNow(ds.InFlight("a")); got != (InFlight{}) {
		t.Errorf("after both ended: %+v, want nothing in flight", got)
	}
}

func TestTheReplayTakesTheRequestsInFlightInTheOrderSent(t *testing.T) {
	t.Parallel()
	ds := NewDatastore(nil)
	ds.SetEngineLimits(enginesched.Limits{MaxNumSeqs: 2, MaxBatchedTokens: 1000})
	ds.Upsert(ep("a", "10.0.0.1:8000"))
	t0 := time.Unix(100, 0)
	if got := ds.InFlight("a").Ahead; got != (enginesched.Ahead{}) {
		t.Fatalf("nothing in flight, replayed %+v", got)
	}
	// One decoding with 3 tokens to go (10 asked, 7 come), one waiting
	// for a seat with 1500 of its 2000 prompt tokens to compute.
	dec := ds.Dispatch("a", t0, 100, 400, 10)
	dec.FirstToken(t0)
	dec.Progress(t0.Add(time.Second), 7) // from the fourth token on, every fourth
	ds.Dispatch("a", t0, 1500, 2000, 5)
	// Step 1: a decode (3 → 2 to go), and 999 of the prefill's 1500.
	// Step 2: a decode (→ 1), the prefill's last 501. Both are running:
	// no seat. Step 3: the decoder's last token frees its seat; the
	// prefilled one decodes too. Step 4: one decodes, one seat is free,
	// 999 tokens of budget left.
	want := enginesched.Ahead{
		Steps: 4, DecodeSteps: 4, SeqSteps: 5,
		DecodeContext:  (400 + 7) + (400 + 8) + (400 + 9) + 2001 + 2002,
		PrefillTokens:  1500,
		PrefillContext: 999*(500+999/2) + 501*(1499+501/2),
		Decoding:       1, DecodingContext: 2003, Budget: 1000, FirstChunk: 999,
		UnderWay: true, // step 1: the prefill was sent before it began
	}
	if got := ds.InFlight("a").Ahead; got != want {
		t.Errorf("replayed %+v\nwant     %+v", got, want)
	}
	ds.SetEngineLimits(enginesched.Limits{MaxBatchedTokens: 1000}) // seats: the most seen running
	ds.SetMetrics("a", Metrics{RunningRequests: 8})
	dec.Progress(t0.Add(2*time.Second), 11) // the next fourth token: a replan
	// Step 1: the decoder's last token, 999 of the prefill. Step 2: the
	// prefill's last 501, and 499 left with seats to spare.
	if got := ds.InFlight("a").Ahead; got.Steps != 2 || got.DecodeSteps != 1 || got.FirstChunk != 499 || got.Unseated {
		t.Errorf("with seats free: %+v, want 2 steps, 1 decoding, 499 left", got)
	}
}

func TestTheStepUnderWayIsExpectedToEndAsFarAfterTheLastTokenAsTheOneBefore(t *testing.T) {
	t.Parallel()
	ds := NewDatastore(nil)
	ds.Upsert(ep("a", "10.0.0.1:8000"))
	t0 := time.Unix(100, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	d := ds.Dispatch("a", t0, 10, 10, 100)
	d.FirstToken(at(50))
	if got := ds.InFlight("a").StepEnd; got != 0 {
		t.Errorf("one token says nothing of a step's length, yet the step ends at %v", got)
	}
	d.Progress(at(60), 2)
	if got := ds.InFlight("a").StepEnd; got != at(70).UnixNano() {
		t.Errorf("tokens at 50 and 60ms: the step under way ends at %v, want t0+70ms", got)
	}
	d.Progress(at(90), 4) // two tokens in 30ms: 15ms a step
	if got := ds.InFlight("a").StepEnd; got != at(105).UnixNano() {
		t.Errorf("then two more by 90ms: %v, want t0+105ms", got)
	}
	d.Done()
	if got := ds.InFlight("a").StepEnd; got != 0 {
		t.Errorf("nothing decodes, yet a step ends at %v", got)
	}
}

func TestRecentPrefillFadesWithTheWindow(t *testing.T) {
	t.Parallel()
	ds := NewDatastore(nil)
	ds.Upsert(ep("a", "10.0.0.1:8000"))
	t0 := time.Unix(100, 0)
	ds.Dispatch("a", t0, 1000, 1000, 0).Done()
	ds.Dispatch("a", t0.Add(RecentPrefillWindow), 500, 600, 0)
	f := ds.InFlight("a")
	// 1000 tokens a window ago weigh 1000/e, besides the 500 sent now.
	if want := 500 + 1000/math.E; math.Abs(f.RecentPrefill-want) > 1e-9 || f.RecentPrefillAt != t0.Add(RecentPrefillWindow).UnixNano() {
		t.Errorf("recent prefill %v at %v, want %v at t0+window", f.RecentPrefill, f.RecentPrefillAt, want)
	}
	at := t0.Add(2 * RecentPrefillWindow)
	if got, want := f.RecentPrefillRate(at.UnixNano()), (500+1000/math.E)/math.E/RecentPrefillWindow.Seconds(); math.Abs(got-want) > 1e-9 {
		t.Errorf("rate a window later %v, want %v", got, want)
	}
	if got := (&InFlight{}).RecentPrefillRate(at.UnixNano()); got != 0 {
		t.Errorf("no prefill sent: rate %v", got)
	}
}

// A response that ended after its first token counts in RecentEnds from
// its end, fading with the window; one that never began does not count.
func TestRecentEndsCountsFinishedResponsesFadingWithTheWindow(t *testing.T) {
	t.Parallel()
	ds := NewDatastore(nil)
	ds.Upsert(ep("a", "10.0.0.1:8000"))
	t0 := time.Unix(100, 0)
	failed := ds.Dispatch("a", t0, 100, 100, 8)
	failed.DoneAt(t0)
	if f := ds.InFlight("a"); f.RecentEnds != 0 || f.RecentEndsAt != 0 {
		t.Fatalf("a request that never began counts: %v at %v", f.RecentEnds, f.RecentEndsAt)
	}
	d1 := ds.Dispatch("a", t0, 100, 100, 8)
	d1.FirstToken(t0.Add(10 * time.Millisecond))
	d1.DoneAt(t0.Add(50 * time.Millisecond))
	d2 := ds.Dispatch("a", t0, 100, 100, 8)
	d2.FirstToken(t0.Add(20 * time.Millisecond))
	end := t0.Add(50*time.Millisecond + RecentEndsWindow)
	d2.DoneAt(end)
	f := ds.InFlight("a")
	// One end a window ago weighs 1/e, besides the one now.
	if want := 1 + 1/math.E; math.Abs(f.RecentEnds-want) > 1e-9 || f.RecentEndsAt != end.UnixNano() {
		t.Errorf("recent ends %v at %v, want %v at the second end", f.RecentEnds, f.RecentEndsAt, want)
	}
	if got, want := f.RecentEndsNow(end.Add(RecentEndsWindow).UnixNano()), (1+1/math.E)/math.E; math.Abs(got-want) > 1e-9 {
		t.Errorf("a window later %v, want %v", got, want)
	}
	if got := (&InFlight{}).RecentEndsNow(end.UnixNano()); got != 0 {
		t.Errorf("nothing ended: %v", got)
	}
}

// Ended holds when the last EndedKept responses that began decoding
// ended, the latest replacing the oldest; one that never began is not
// among them, and one done without a time ended at the last change told.
func TestEndedHoldsTheLastEnds(t *testing.T) {
	t.Parallel()
	ds := NewDatastore(nil)
	ds.Upsert(ep("a", "10.0.0.1:8000"))
	t0 := time.Unix(100, 0)
	ds.Dispatch("a", t0, 100, 100, 8).DoneAt(t0.Add(time.Hour))
	if f := ds.InFlight("a"); f.Ended != ([EndedKept]int64{}) {
		t.Fatalf("a request that never began is among the ends: %v", f.Ended)
	}
	var want []int64
	for i := range EndedKept + 3 {
		d := ds.Dispatch("a", t0, 100, 100, 8)
		d.FirstToken(t0.Add(time.Duration(i) * time.Millisecond))
		end := t0.Add(time.Duration(i)*time.Millisecond + time.Second)
		d.DoneAt(end)
		want = append(want, end.UnixNano())
	}
	d := ds.Dispatch("a", t0, 100, 100, 8)
	last := t0.Add(2 * time.Second)
	d.FirstToken(last)
	d.Done()
	want = append(want, last.UnixNano())
	got := ds.InFlight("a").Ended
	slices.Sort(got[:])
	if w := want[len(want)-EndedKept:]; !slices.Equal(got[:], w) {
		t.Errorf("ends %v, want the last %d: %v", got, EndedKept, w)
	}
}

func TestPrefillDoneByQueuesPrefillsInTheOrderSentAndResetsAtEachFirstToken(t *testing.T) {
	t.Parallel()
	ds := NewDatastore(nil)
	ds.Upsert(ep("a", "10.0.0.1:8000"))
	at := func(ms int) time.Time { return time.Unix(1000, 0).Add(time.Duration(ms) * time.Millisecond) }
	doneBy := func() time.Time {
		if n := ds.InFlight("a").PrefillDoneBy; n != 0 {
			return time.Unix(0, n)
		}
		return time.Time{}
	}

	d1 := ds.Dispatch("a", at(0), 2000, 2000, 0)
	if !doneBy().IsZero() {
		t.Fatalf("a dispatch of unknown prefill time is expected done by %v", doneBy())
	}
	d1.ExpectPrefill(100 * time.Millisecond)
	d1.ExpectPrefill(time.Hour) // said once only
	d2 := ds.Dispatch("a", at(50), 1000, 1000, 0)
	d2.ExpectPrefill(50 * time.Millisecond)
	d3 := ds.Dispatch("a", at(60), 600, 600, 0)
	d3.ExpectPrefill(30 * time.Millisecond)
	if got, want := doneBy(), at(180); !got.Equal(want) {
		t.Fatalf("three prefills of 100, 50 and 30 ms sent at 0, 50 and 60 ms are expected done by %v, want %v", got, want)
	}
	// The first finished early: the other two are expected from then on.
	d1.FirstToken(at(80))
	if got, want := doneBy(), at(160); !got.Equal(want) {
		t.Fatalf("after the first's first token at 80 ms: done by %v, want %v", got, want)
	}
	d1.ExpectPrefill(time.Second) // past its prefill: ignored
	// The second ended without a first token: only its own time is taken off.
	d2.Done()
	if got, want := doneBy(), at(110); !got.Equal(want) {
		t.Fatalf("after the second ended unanswered: done by %v, want %v", got, want)
	}
	d3.FirstToken(at(120))
	if !doneBy().IsZero() {
		t.Errorf("with no prefill in flight the queue is expected done by %v, want none", doneBy())
	}
	// A queue that drained before the next request sends it alone.
	d4 := ds.Dispatch("a", at(500), 100, 100, 0)
	d4.ExpectPrefill(20 * time.Millisecond)
	if got, want := doneBy(), at(520); !got.Equal(want) {
		t.Errorf("a prefill sent to an idle endpoint at 500 ms is expected done by %v, want %v", got, want)
	}
	d4.Done()
}

func TestInFlightSurvivesAReplacementAtTheSameAddressOnly(t *testing.T) {
	t.Parallel()
	ds := NewDatastore(nil)
	ds.Upsert(ep("a", "10.0.0.1:8000"))
	d := ds.Dispatch("a", time.Now(), 10, 10, 0)
	e := ep("a", "10.0.0.1:8000")
	e.Labels = map[string]string{"new": "label"}
	ds.Upsert(e)
	if got := ds.InFlight("a").Prefilling; got != 1 {
		t.Errorf("after a relabel the endpoint has %d requests prefilling, want 1", got)
	}
	ds.Upsert(ep("a", "10.0.0.9:8000"))
	if got := inFlightNow(ds.InFlight("a")); got != (InFlight{}) {
		t.Errorf("a new address inherited %+v", got)
	}
	d.Done() // the old address's request ends: no effect on the new one
	if got := inFlightNow(ds.InFlight("a")); got != (InFlight{}) {
		t.Errorf("after the old request ended: %+v", got)
	}
	if ds.Dispatch("nobody", time.Now(), 1, 1, 0) != nil {
		t.Error("a dispatch to an unknown endpoint was accounted")
	}
	var nilDispatch *Dispatch
	nilDispatch.ExpectDecode(time.Second)
	nilDispatch.ExpectPrefill(time.Second)
	nilDispatch.FirstToken(time.Now())
	nilDispatch.Progress(time.Now(), 9)
	nilDispatch.Done()
}

func TestInFlightUnderConcurrentRequestsReturnsToZero(t *testing.T) {
	t.Parallel()
	ds := NewDatastore(nil)
	ds.Upsert(ep("a", "10.0.0.1:8000"))
	var wg sync.WaitGroup
	for i := range 64 {
		wg.Go(func() {
			d := ds.Dispatch("a", time.Unix(int64(i), 0), i, 2*i, 2+i)
			d.ExpectPrefill(time.Duration(i+1) * time.Millisecond)
			if i%2 == 0 {
				d.ExpectDecode(time.Duration(i) * time.Millisecond)
				d.FirstToken(time.Unix(int64(i), 0))
				d.Progress(time.Unix(int64(i), 5e8), 4+i%8)
			}
			d.Done()
		})
	}
	wg.Wait()
	if got := inFlightNow(ds.InFlight("a")); got != (InFlight{}) {
		t.Errorf("after every request ended: %+v", got)
	}
}

func TestObjectives(t *testing.T) {
	t.Parallel()
	o := NewObjectives(nil)
	o.Set(Objective{Name: "chat", Priority: 1, TTFT: time.Second})
	o.Set(Objective{Name: "batch", Priority: -1})
	if got, ok := o.Get("chat"); !ok || got.Priority != 1 || got.TTFT != time.Second {
		t.Errorf("Get(chat) = %+v, %v", got, ok)
	}
	o.Delete("chat")
	if _, ok := o.Get("chat"); ok {
		t.Error("a deleted objective is still there")
	}
	o.Replace([]Objective{{Name: "x"}, {Name: "a"}})
	if l := o.List(); len(l) != 2 || l[0].Name != "a" || l[1].Name != "x" {
		t.Errorf("after Replace: %+v", l)
	}
	var none *Objectives
	if _, ok := none.Get("a"); ok {
		t.Error("a nil set found an objective")
	}
}

func TestTheDecodeEndsAreTheExpectedEndsInOrder(t *testing.T) {
	t.Parallel()
	ds := NewDatastore(nil)
	ds.Upsert(ep("a", "10.0.0.1:8000"))
	t0 := time.Unix(100, 0)
	long, short, unknown := ds.Dispatch("a", t0, 1, 1, 2), ds.Dispatch("a", t0, 1, 1, 2), ds.Dispatch("a", t0, 1, 1, 0)
	long.ExpectDecode(time.Second)
	short.ExpectDecode(300 * time.Millisecond)
	if f := ds.InFlight("a"); f.DecodeEnds[0] != 0 || f.OldestPrefill != t0.UnixNano() {
		t.Fatal("an end is expected before anything decodes")
	}
	long.FirstToken(t0)
	short.FirstToken(t0.Add(100 * time.Millisecond))
	unknown.FirstToken(t0) // no max_tokens: no expectation
	f := ds.InFlight("a")
	if got := f.DecodeEnds[0]; got != t0.Add(400*time.Millisecond).UnixNano() {
		t.Errorf("next end %v, want the short one's, t0+400ms", time.Unix(0, got))
	}
	if want := [DecodeEndsKept]int64{t0.Add(400 * time.Millisecond).UnixNano(), t0.Add(time.Second).UnixNano()}; f.DecodeEnds != want {
		t.Errorf("decode ends %v, want %v", f.DecodeEnds, want)
	}
	short.Done()
	if got := ds.InFlight("a").DecodeEnds[0]; got != t0.Add(time.Second).UnixNano() {
		t.Errorf("after the short one ended: %v, want t0+1s", time.Unix(0, got))
	}
	long.Done()
	unknown.Done()
	if got := inFlightNow(ds.InFlight("a")); got != (InFlight{}) {
		t.Errorf("after all ended: %+v", got)
	}
}

func TestTheDecodeEndsKeepTheEarliestOfMany(t *testing.T) {
	t.Parallel()
	ds := NewDatastore(nil)
	ds.Upsert(ep("a", "10.0.0.1:8000"))
	t0 := time.Unix(100, 0)
	rng := rand.New(rand.NewPCG(1, 2))
	var live []*Dispatch
	var want []int64
	for range 200 {
		if len(live) > 0 && rng.IntN(3) == 0 {
			i := rng.IntN(len(live))
			end := live[i].end
			live[i].Done()
			want = slices.Delete(want, slices.Index(want, end), slices.Index(want, end)+1)
			live = slices.Delete(live, i, i+1)
		} else {
			d := ds.Dispatch("a", t0, 1, 1, 2)
			d.ExpectDecode(time.Duration(1+rng.IntN(50)) * time.Millisecond) // ties too
			d.FirstToken(t0)
			live = append(live, d)
			want = append(want, d.end)
		}
		slices.Sort(want)
		var w [DecodeEndsKept]int64
		copy(w[:], want)
		if got := ds.InFlight("a").DecodeEnds; got != w {
			t.Fatalf("decode ends %v, want the earliest of %v", got, want)
		}
	}
}

func TestAnExpectedEndFollowsThePaceTheTokensComeAt(t *testing.T) {
	t.Parallel()
	ds := NewDatastore(nil)
	ds.Upsert(ep("a", "10.0.0.1:8000"))
	t0 := time.Unix(100, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	ends := func(ms ...int) (e [DecodeEndsKept]int64) {
		for i, m := range ms {
			e[i] = at(m).UnixNano()
		}
		return e
	}
	a, b := ds.Dispatch("a", t0, 1, 1, 33), ds.Dispatch("a", t0, 1, 1, 2)
	a.ExpectDecode(10 * time.Millisecond) // 32 tokens after the first: t0+320ms
	b.ExpectDecode(400 * time.Millisecond)
	a.FirstToken(t0)
	b.FirstToken(t0)
	for _, step := range []struct {
		name string
		do   func()
		want [DecodeEndsKept]int64
	}{
		{"at the first tokens, the predicted paces", func() {}, ends(320, 400)},
		{"three tokens say too little to go by", func() { a.Progress(at(60), 3) }, ends(320, 400)},
		{"four tokens in 60ms: 20ms each, 29 to come", func() { a.Progress(at(60), 4) }, ends(400, 640)},
		{"the next tokens are read every fourth", func() { a.Progress(at(65), 5) }, ends(400, 640)},
		{"eight tokens in 70ms: 10ms each, 25 to come", func() { a.Progress(at(70), 8) }, ends(320, 400)},
		{"more tokens than max_tokens said: ending now", func() { a.Progress(at(700), 40) }, ends(400, 700)},
		{"an ended request's end is gone", func() { a.Done() }, ends(400)},
		{"and progress after its end puts none back", func() { a.Progress(at(800), 44) }, ends(400)},
	} {
		step.do()
		if got := ds.InFlight("a").DecodeEnds; got != step.want {
			t.Fatalf("%s: decode ends %v, want %v", step.name, got, step.want)
		}
	}
	b.Done()
	if got := inFlightNow(ds.InFlight("a")); got != (InFlight{}) {
		t.Errorf("after both ended: %+v", got)
	}
}

// replayModel is the test's own account of what an endpoint holds, in the
// order sent, to replay afresh.
type replayModel struct {
	d                              *Dispatch
	prefill, prompt, outputs, seen int
	start                          int64
}

// freshReplay replays held from scratch, as the endpoint's scheduler
// would be replayed at the moment of reading.
func freshReplay(held []replayModel, lastToken int64, lim enginesched.Limits) enginesched.Ahead {
	if len(held) == 0 {
		return enginesched.Ahead{}
	}
	var seqs []enginesched.Seq
	for _, h := range held {
		outputs := h.outputs
		if outputs == 0 {
			outputs = defaultOutputs
		}
		s := enginesched.Seq{Outputs: outputs - h.seen}
		if h.seen == 0 {
			s.Prefill, s.Context, s.Started = h.prefill, h.prompt-h.prefill, h.start < lastToken
		} else {
			s.Context = h.prompt + h.seen
		}
		seqs = append(seqs, s)
	}
	var r enginesched.Replayer
	return r.Replay(seqs, lim)
}

func TestTheReplayReadAfterInterleavedChangesIsAFreshReplays(t *testing.T) {
	t.Parallel()
	for _, n := range []int{8, 300} { // 300: past the requests a replay takes
		ds := NewDatastore(nil)
		lim := enginesched.Limits{MaxNumSeqs: 16, MaxBatchedTokens: 2048}
		ds.SetEngineLimits(lim)
		ds.Upsert(ep("a", "10.0.0.1:8000"))
		rng := rand.New(rand.NewPCG(uint64(n), 1))
		var held []replayModel
		var lastToken int64
		now := time.Unix(100, 0).UnixNano()
		for op := range 4 * n {
			now += int64(rng.IntN(3)) * int64(time.Millisecond)
			switch k := rng.IntN(10); {
			case k < 4 || len(held) < n/2:
				h := replayModel{prefill: 1 + rng.IntN(3000), outputs: rng.IntN(40), start: now}
				h.prompt = h.prefill + rng.IntN(1000)
				h.d = ds.Dispatch("a", time.Unix(0, now), h.prefill, h.prompt, h.outputs)
				held = append(held, h)
			case k < 6:
				i := rng.IntN(len(held))
				if held[i].seen == 0 {
					held[i].d.FirstToken(time.Unix(0, now))
					held[i].seen, lastToken = 1, max(lastToken, now)
				}
			case k < 8:
				i := rng.IntN(len(held))
				if h := &held[i]; h.seen > 0 && h.outputs > 0 {
					tokens := h.seen + 1 + rng.IntN(8)
					h.d.Progress(time.Unix(0, now), tokens)
					h.seen, lastToken = tokens, max(lastToken, now)
				}
			default:
				i := rng.IntN(len(held))
				held[i].d.DoneAt(time.Unix(0, now))
				held = slices.Delete(held, i, i+1)
			}
			if op%3 != 0 { // some changes come in batches between reads
				continue
			}
			got := ds.InFlight("a")
			if want := freshReplay(held, lastToken, lim); got.Ahead != want {
				t.Fatalf("%d in flight, after change %d: replayed %+v\nfresh    %+v", len(held), op, got.Ahead, want)
			}
			if len(held) > 0 && got.ReplayedAt == 0 {
				t.Fatalf("after change %d: no replay time with %d in flight", op, len(held))
			}
		}
	}
}

func TestTheReplayReadAfterConcurrentChangesIsAFreshReplays(t *testing.T) {
	t.Parallel()
	ds := NewDatastore(nil)
	lim := enginesched.Limits{MaxNumSeqs: 8, MaxBatchedTokens: 4096}
	ds.SetEngineLimits(lim)
	ds.Upsert(ep("a", "10.0.0.1:8000"))
	t0 := time.Unix(100, 0)
	var mu sync.Mutex
	var held []replayModel
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 2 { // picks reading meanwhile, some of them replaying
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
					ds.Candidates(nil)
				}
			}
		})
	}
	var writers sync.WaitGroup
	for g := range 8 {
		writers.Go(func() {
			for i := range 50 {
				at := t0.Add(time.Duration(g*1000+i) * time.Microsecond)
				d := ds.Dispatch("a", at, 100+i, 500+i, 0)
				if i%5 == 0 { // left in flight, prefilling
					mu.Lock()
					held = append(held, replayModel{d: d, prefill: 100 + i, prompt: 500 + i, start: at.UnixNano()})
					mu.Unlock()
					continue
				}
				d.Done()
			}
		})
	}
	writers.Wait()
	close(stop)
	wg.Wait()
	// The order sent is the order the endpoint took them in; the model's
	// list was appended under a lock of its own, so order it the same way.
	sent := ds.snap.Load().byName["a"].load.sent
	order := make(map[*Dispatch]int, len(sent))
	for i, d := range sent {
		order[d] = i
	}
	slices.SortFunc(held, func(a, b replayModel) int { return order[a.d] - order[b.d] })
	if got, want := ds.InFlight("a").Ahead, freshReplay(held, 0, lim); got != want {
		t.Errorf("after the writers stopped: replayed %+v\nfresh    %+v", got, want)
	}
}

func TestAReadDuringAReplayTakesTheLastOneAndTheNextReadReplays(t *testing.T) {
	t.Parallel()
	ds := NewDatastore(nil)
	lim := enginesched.Limits{MaxNumSeqs: 4, MaxBatchedTokens: 1000}
	ds.SetEngineLimits(lim)
	ds.Upsert(ep("a", "10.0.0.1:8000"))
	t0 := time.Unix(100, 0)
	first := ds.Dispatch("a", t0, 1500, 2000, 5)
	before := ds.InFlight("a")
	want := freshReplay([]replayModel{{prefill: 1500, prompt: 2000, outputs: 5, start: t0.UnixNano()}}, 0, lim)
	if before.Ahead != want || before.ReplayedAt != t0.UnixNano() {
		t.Fatalf("one in flight: replayed %+v at %d, want %+v at %d", before.Ahead, before.ReplayedAt, want, t0.UnixNano())
	}
	c := ds.snap.Load().byName["a"].load
	c.planMu.Lock() // a replay under way on another goroutine
	second := ds.Dispatch("a", t0.Add(time.Second), 700, 900, 5)
	if got := ds.InFlight("a"); got.Ahead != before.Ahead || got.ReplayedAt != before.ReplayedAt || got.Prefilling != 2 {
		t.Errorf("read during a replay: %+v at %d with %d prefilling, want the last replay and 2", got.Ahead, got.ReplayedAt, got.Prefilling)
	}
	c.planMu.Unlock()
	want = freshReplay([]replayModel{
		{prefill: 1500, prompt: 2000, outputs: 5, start: t0.UnixNano()},
		{prefill: 700, prompt: 900, outputs: 5, start: t0.Add(time.Second).UnixNano()},
	}, 0, lim)
	if got := ds.InFlight("a"); got.Ahead != want || got.ReplayedAt != t0.Add(time.Second).UnixNano() {
		t.Errorf("read after it: %+v at %d, want %+v", got.Ahead, got.ReplayedAt, want)
	}
	first.Done()
	second.Done()
	if got := ds.InFlight("a"); got.Ahead != (enginesched.Ahead{}) || got.ReplayedAt != 0 {
		t.Errorf("nothing in flight: %+v at %d", got.Ahead, got.ReplayedAt)
	}
}
