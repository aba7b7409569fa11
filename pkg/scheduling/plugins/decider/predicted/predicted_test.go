package predicted_test

import (
	"context"
	"encoding/json"
	"errors"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/internal/kvlink"
	"math"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/predict"
	"github.com/kvroute/kvroute/pkg/prepare/predictedlatency"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/decider/predicted"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/filter/bylabel"
)

// Dynamo's conditions as its own tests state them, blocks of 64 tokens:
// prompt, cached blocks, the absolute and ratio thresholds, and whether
// the request stays on its decode pod.
func TestDynamosConditionsKeepLocalAsDynamosTestsSay(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name         string
		prompt, held int
		maxLocal     int
		ratio        float64
		local        bool
	}{
		{"1000 tokens with 14 blocks cached: 104 uncached stay", 1000, 14, 2048, 0.7, true},
		{"100,000 tokens with 1,000 blocks cached: 36,000 uncached go", 100000, 1000, 2048, 0.99, false},
		{"200 cold tokens are all uncached, over the ratio", 200, 0, 2048, 0.7, false},
		{"2048 cold tokens reach the absolute threshold", 2048, 0, 2048, 0.99, false},
		{"an empty prompt stays", 0, 0, 2048, 0.7, true},
		{"more cached than the prompt stays", 100, 4, 2048, 0.7, true},
	}
	for _, tt := range tests {
		if got := predicted.KeepLocal(tt.prompt, tt.held*64, tt.maxLocal, tt.ratio); got != tt.local {
			t.Errorf("%s: keep local %v, want %v", tt.name, got, tt.local)
		}
	}
}

// pool is a decode pod d and prefill pods p0.., known to a real in-process
// predictor (its prior, an 8B model on one GPU), with the scraped queues
// given, d holding held of the prompt's 16-token blocks in GPU memory.
type pool struct {
	decodeQueue  int
	prefillQueue []int
	held         int
	// decoding is how many sequences the EPP has decoding on d, each
	// with a 2000-token context; rankDecoding, when set, makes d a pod of
	// data-parallel ranks with that many decoding on each rank.
	decoding     int
	rankDecoding []int
	// decodeAt and prefillAt are where the pods run (unknown when unset).
	decodeAt  datalayer.Topology
	prefillAt []datalayer.Topology
}

func (pl pool) candidates(t *testing.T, req *request.Request) []*datalayer.Candidate {
	t.Helper()
	pred, err := predict.New(predict.Options{Synchronous: true})
	if err != nil {
		t.Fatal(err)
	}
	prod, err := predictedlatency.New("", predictedlatency.InProcess{P: pred}, 2*time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	ds := datalayer.NewDatastore(nil)
	add := func(name, addr, role string, queue, ranks int, at datalayer.Topology) {
		pred.AddEndpoint(addr, "")
		ds.Upsert(&datalayer.Endpoint{Name: name, Address: addr, Labels: map[string]string{bylabel.RoleLabel: role}, Topology: at})
		ds.SetMetrics(name, datalayer.Metrics{WaitingQueueSize: queue, RunningRequests: 8, DataParallelRanks: ranks, UpdateTime: now})
	}
	add("d", "10.0.0.1:8000", bylabel.RoleDecode, pl.decodeQueue, len(pl.rankDecoding), pl.decodeAt)
	for i, q := range pl.prefillQueue {
		var at datalayer.Topology
		if i < len(pl.prefillAt) {
			at = pl.prefillAt[i]
		}
		add("p"+string(rune('0'+i)), "10.0.1."+string(rune('1'+i))+":8000", bylabel.RolePrefill, q, 0, at)
	}
	cands := ds.Candidates(nil)
	total := len(req.TokenIDs) / 16
	for _, c := range cands {
		info := datalayer.PrefixCacheInfo{TotalBlocks: total, BlockSizeTokens: 16, Exact: true, State: datalayer.StreamExact}
		if c.Name == "d" {
			info.MatchBlocks, info.MatchTokens = pl.held, pl.held*16
			info.BlocksByTier[events.TierGPU] = pl.held
		}
		c.Stream = datalayer.StreamExact
		c.Put(datalayer.PrefixCacheMatchInfoKey, info)
		if c.Name == "d" {
			// Before the prediction, which weighs them too.
			decoding := pl.decoding
			for _, n := range pl.rankDecoding {
				c.RankLoads = append(c.RankLoads, datalayer.RankLoad{Decoding: n})
				decoding += n
			}
			c.InFlight.Decoding, c.InFlight.DecodeTokens = decoding, decoding*2000
		}
	}
	if err := prod.Produce(context.Background(), req, cands); err != nil {
		t.Fatal(err)
	}
	return cands
}

func decide(t *testing.T, raw string, pl pool, tokens int) framework.Verdict {
	t.Helper()
	p, err := predicted.Factory("pl", json.RawMessage(raw), nil)
	if err != nil {
		t.Fatal(err)
	}
	req := &request.Request{TokenIDs: make([]uint32, tokens), MaxTokens: 100}
	cands := pl.candidates(t, req)
	cs := framework.NewCycleState(time.Now(), 1, 2)
	cs.SetCandidates(cands)
	return p.(framework.Decider).Disaggregate(context.Background(), cs, req, cands[0])
}

func TestThePredictionsDecideTheSplit(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		pool   pool
		tokens int
		split  bool
		reason string
	}{
		{"a decode pod holding most of the prompt keeps it", pool{decodeQueue: 6, prefillQueue: []int{0}, held: 480}, 8000, false, predicted.ReasonPredictedSlower},
		{"a long cold prompt goes to an idle prefill pool", pool{decodeQueue: 6, prefillQueue: []int{0, 3}}, 8000, true, predicted.ReasonPredictedFaster},
		{"a busy prefill pool keeps it local", pool{decodeQueue: 6, prefillQueue: []int{20, 25}}, 8000, false, predicted.ReasonPredictedSlower},
		{"an idle decode pod prefills a cold prompt itself, sparing the transfer", pool{prefillQueue: []int{0}}, 8000, false, predicted.ReasonPredictedSlower},
		{"a prompt held whole never moves", pool{decodeQueue: 6, prefillQueue: []int{0}, held: 500}, 8000, false, framework.ReasonCached},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if v := decide(t, "", tt.pool, tt.tokens); v.Split != tt.split || v.Reason != tt.reason {
				t.Errorf("verdict %+v, want split %v (%s)", v, tt.split, tt.reason)
			}
		})
	}
}

func TestDynamosThresholdsAndBusyPoolAreParameters(t *testing.T) {
	t.Parallel()
	cold := pool{decodeQueue: 6, prefillQueue: []int{0, 3}}
	// 3200 of 8000 tokens uncached: under 4096 and under 0.7 of the prompt.
	warm := pool{decodeQueue: 6, prefillQueue: []int{0, 3}, held: 300}
	if v := decide(t, `{"maxLocalPrefillLength": 4096, "maxLocalPrefillRatio": 0.7}`, warm, 8000); v.Split || v.Reason != predicted.ReasonLocalThresholds {
		t.Errorf("under both of Dynamo's thresholds: verdict %+v, want kept local", v)
	}
	if v := decide(t, `{"maxLocalPrefillLength": 2048, "maxLocalPrefillRatio": 0.7}`, cold, 8000); !v.Split {
		t.Errorf("8000 uncached tokens over 2048: verdict %+v, want the prediction to split it", v)
	}
	if v := decide(t, `{"maxPrefillQueue": 3}`, pool{decodeQueue: 6, prefillQueue: []int{3, 4}}, 8000); v.Split || v.Reason != predicted.ReasonPrefillBusy {
		t.Errorf("every prefill pod at maxPrefillQueue: verdict %+v, want prefill-busy", v)
	}
	if v := decide(t, `{"maxPrefillQueue": 3}`, cold, 8000); !v.Split {
		t.Errorf("a prefill pod under maxPrefillQueue: verdict %+v, want a split", v)
	}
}

func TestWithoutPrefillPodsTheThresholdStillSaysSplit(t *testing.T) {
	t.Parallel()
	// No pod to predict the remote side on: the exact threshold decides,
	// and says split, for the handler's fallback to count.
	if v := decide(t, "", pool{decodeQueue: 6}, 8000); !v.Split || v.Reason != framework.ReasonUncached {
		t.Errorf("verdict %+v", v)
	}
	if v := decide(t, "", pool{decodeQueue: 6, held: 400}, 8000); v.Split || v.Reason != framework.ReasonCached {
		t.Errorf("1600 uncached tokens under 2048: verdict %+v", v)
	}
	if v := decide(t, `{"nonCachedTokens": 0}`, pool{decodeQueue: 6}, 8000); v.Split {
		t.Errorf("nonCachedTokens 0: verdict %+v", v)
	}
}

func TestTheTransferMovesWholeBlocksOverTheLink(t *testing.T) {
	t.Parallel()
	p, err := predicted.New("t", predicted.Params{Params: kvlink.Params{KVBytesPerToken: 1e6, TransferGBps: 1, TransferLatencyMs: 2}, MaxLocalPrefillRatio: 0.7})
	if err != nil {
		t.Fatal(err)
	}
	// 17 tokens in blocks of 16 move 32 tokens: 32 MB at 1 GB/s is 32 ms.
	if got := p.TransferMs(17, 16); got != 34 {
		t.Errorf("TransferMs(17, 16) = %v, want 34", got)
	}
	if got := p.TransferMs(0, 16); got != 0 {
		t.Errorf("nothing to move: %v", got)
	}
}

func TestTheTransferDependsOnTheDistanceBetweenThePods(t *testing.T) {
	t.Parallel()
	at := func(host, rack, zone, region string) datalayer.Topology {
		return datalayer.Topology{Host: host, Rack: rack, Zone: zone, Region: region}
	}
	decodeAt := at("h1", "r1", "z1", "g1")
	// A slow link between regions: 8000 tokens' KV (1 GB) takes 2 s.
	const params = `{"transferByDistance": {"host": {"gbps": 100, "latencyMs": 0.2}, "region": {"gbps": 0.5, "latencyMs": 20}}}`
	near := pool{decodeQueue: 6, prefillQueue: []int{0}, decodeAt: decodeAt, prefillAt: []datalayer.Topology{at("h1", "r1", "z1", "g1")}}
	far := pool{decodeQueue: 6, prefillQueue: []int{0}, decodeAt: decodeAt, prefillAt: []datalayer.Topology{at("h9", "r9", "z9", "g1")}}
	if v := decide(t, params, near, 8000); !v.Split || v.Reason != predicted.ReasonPredictedFaster {
		t.Errorf("an idle prefill pod on the decode pod's host: verdict %+v, want a split", v)
	}
	if v := decide(t, params, far, 8000); v.Split || v.Reason != predicted.ReasonPredictedSlower {
		t.Errorf("an idle prefill pod a region away: verdict %+v, want kept local", v)
	}
	// With both, the near pod decides, though the far one is as idle.
	both := pool{decodeQueue: 6, prefillQueue: []int{0, 0}, decodeAt: decodeAt, prefillAt: []datalayer.Topology{far.prefillAt[0], near.prefillAt[0]}}
	if v := decide(t, params, both, 8000); !v.Split {
		t.Errorf("a far and a near prefill pod: verdict %+v, want a split", v)
	}

	p, err := predicted.New("t", predicted.DefaultParams())
	if err != nil {
		t.Fatal(err)
	}
	// 8192 tokens of 131072 bytes: 1.07 GB.
	for _, tc := range []struct {
		dist datalayer.Distance
		want float64
	}{
		{datalayer.SameHost, 0.2 + 1073741824/100e6},
		{datalayer.SameRack, 0.5 + 1073741824/25e6},
		{datalayer.SameZone, 1 + 1073741824/12.5e6},
		{datalayer.SameRegion, 5 + 1073741824/2.5e6},
		{datalayer.Apart, 1 + 1073741824/12.5e6},
		{datalayer.Unknown, 1 + 1073741824/12.5e6},
	} {
		if got := p.TransferMsAt(8192, 16, tc.dist); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("by default, a transfer at distance %s takes %v ms, want %v", tc.dist, got, tc.want)
		}
	}
}

func TestParametersOutOfRangeAreRefused(t *testing.T) {
	t.Parallel()
	for _, raw := range []string{
		`{"kvBytesPerToken": 0}`, `{"transferGBps": -1}`, `{"transferLatencyMs": -1}`, `{"minGain": 1}`,
		`{"maxLocalPrefillLength": -1}`, `{"maxLocalPrefillRatio": 1.5}`, `{"maxPrefillQueue": -1}`, `{"nonCachedTokens": -1}`,
		`{"decodeStallWeight": -0.5}`, `{"decodeStallWeight": 1e400}`, `{"decodeStallWeight": "1"}`,
		`{"bandwidth": 1}`, `{"transferByDistance": {"datacenter": {"gbps": 1}}}`, `{"transferByDistance": {"rack": {"gbps": 0}}}`,
		`{"transferByDistance": {"host": {"gbps": 10, "latencyMs": -1}}}`,
	} {
		if _, err := predicted.Factory("pl", json.RawMessage(raw), nil); !errors.Is(err, framework.ErrInvalidParams) {
			t.Errorf("%s: err = %v, want ErrInvalidParams", raw, err)
		}
	}
}

func TestTheStallOfTheDecodePodsSequencesCanTipTheSplit(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		params string
		pool   pool
		split  bool
		reason string
	}{
		// A cold 8000-token prompt is predicted sooner on the idle decode
		// pod itself (no transfer), but its prefill would hold up the 16
		// sequences decoding there for its whole engine time.
		{"sixteen sequences decoding send a cold prompt away by default", "", pool{prefillQueue: []int{0}, decoding: 16}, true, predicted.ReasonPredictedCheaper},
		{"at weight 1 too", `{"decodeStallWeight": 1}`, pool{prefillQueue: []int{0}, decoding: 16}, true, predicted.ReasonPredictedCheaper},
		{"at weight 0 the request's own TTFT keeps it local", `{"decodeStallWeight": 0}`, pool{prefillQueue: []int{0}, decoding: 16}, false, predicted.ReasonPredictedSlower},
		// 480 of 500 blocks cached: the local prefill is short, and two
		// sequences' stall of it is less than the remote path's extra wait.
		{"a short local prefill beside two sequences stays", "", pool{decodeQueue: 6, prefillQueue: []int{0}, held: 480, decoding: 2}, false, predicted.ReasonPredictedSlower},
		// One sequence doubles the local cost of a cold prompt: the remote
		// path saves about a third of it, over a minGain of 0.1, not of 0.5.
		{"one sequence decoding is enough for a cold prompt", "", pool{prefillQueue: []int{0}, decoding: 1}, true, predicted.ReasonPredictedCheaper},
		{"minGain asks the remote path to save its share of the total", `{"minGain": 0.5}`, pool{prefillQueue: []int{0}, decoding: 1}, false, predicted.ReasonPredictedSlower},
		// Only the rank the request would go to shares its steps with it.
		{"a pod whose idlest rank decodes nothing keeps it", "", pool{prefillQueue: []int{0}, rankDecoding: []int{16, 0}}, false, predicted.ReasonPredictedSlower},
		{"a pod whose every rank decodes sends it away", "", pool{prefillQueue: []int{0}, rankDecoding: []int{16, 16}}, true, predicted.ReasonPredictedCheaper},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if v := decide(t, tt.params, tt.pool, 8000); v.Split != tt.split || v.Reason != tt.reason {
				t.Errorf("verdict %+v, want split %v (%s)", v, tt.split, tt.reason)
			}
		})
	}
}

func TestWithNothingDecodingTheStallWeightChangesNoVerdict(t *testing.T) {
	t.Parallel()
	// Every pod's scrape says 8 running: the weight counts the decoding
	// sequences of the in-flight accounting, none here.
	for _, pl := range []pool{
		{decodeQueue: 6, prefillQueue: []int{0}, held: 480},
		{decodeQueue: 6, prefillQueue: []int{0, 3}},
		{decodeQueue: 6, prefillQueue: []int{20, 25}},
		{prefillQueue: []int{0}},
		{prefillQueue: []int{0}, held: 300},
	} {
		off := decide(t, `{"decodeStallWeight": 0}`, pl, 8000)
		for _, w := range []string{"1", "4"} {
			if on := decide(t, `{"decodeStallWeight": `+w+`}`, pl, 8000); on != off {
				t.Errorf("%+v: weight %s gives %+v, weight 0 %+v", pl, w, on, off)
			}
		}
	}
}

func TestTheStallWeightMustBeFiniteAndNotNegative(t *testing.T) {
	t.Parallel()
	for _, w := range []float64{-1, -1e-9, math.Inf(1), math.Inf(-1), math.NaN()} {
		p := predicted.DefaultParams()
		p.DecodeStallWeight = w
		if _, err := predicted.New("pl", p); !errors.Is(err, framework.ErrInvalidParams) {
			t.Errorf("decodeStallWeight %v: err = %v, want ErrInvalidParams", w, err)
		}
	}
	for _, w := range []float64{0, 0.5, 1, 100} {
		p := predicted.DefaultParams()
		p.DecodeStallWeight = w
		if _, err := predicted.New("pl", p); err != nil {
			t.Errorf("decodeStallWeight %v: %v", w, err)
		}
	}
	if got := predicted.DefaultParams().DecodeStallWeight; got != 1 {
		t.Errorf("default decodeStallWeight %v, want 1", got)
	}
}
