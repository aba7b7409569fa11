package predict

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/kvroute/kvroute/pkg/enginesched"
	"github.com/kvroute/kvroute/pkg/testkit"
)

// BenchmarkPredict is the request path's cost per candidate: one TTFT and
// one TPOT prediction (mean and quantile each) against a learned model.
func BenchmarkPredict(b *testing.B) {
	p, err := New(Options{Synchronous: true})
	if err != nil {
		b.Fatal(err)
	}
	const endpoints = 64
	addrs := make([]string, endpoints)
	for i := range addrs {
		addrs[i] = fmt.Sprintf("10.0.%d.%d:8000", i/250, i%250)
		p.AddEndpoint(addrs[i], "")
	}
	w := &world{rng: rand.New(rand.NewPCG(1, 1)), slow: 1, noise: 0.1}
	for i := range 2000 {
		in := w.input()
		ttft, tpot := w.truth(in)
		p.Observe(Sample{Endpoint: addrs[i%endpoints], Input: in, TTFTMs: ttft, TPOTMs: tpot, HasTTFT: true, HasTPOT: true})
	}
	in := w.input()
	// Every feature set, the replay's too: the cost of a busy endpoint.
	in.Ahead = enginesched.Ahead{Steps: 3, DecodeSteps: 3, SeqSteps: 12, DecodeContext: 40000, PrefillTokens: 900,
		PrefillContext: 5e6, Decoding: 4, DecodingContext: 13000, Budget: 4096, FirstChunk: 100}
	in.StepRestMs, in.RecentPrefillRate = 4, 3000
	in.EndedN = EndedKept
	for i := range in.EndedN {
		in.EndedAgoMs[i] = float64(i) * 150
	}
	b.ReportAllocs()
	b.ResetTimer()
	var sink float64
	cpu := testkit.CPUTime()
	for i := range b.N {
		sink += p.Predict(addrs[i%endpoints], &in).TTFT
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/candidate")
	b.ReportMetric(float64((testkit.CPUTime()-cpu).Nanoseconds())/float64(b.N), "cpu-ns/candidate")
	if math.IsNaN(sink) {
		b.Fatal("NaN")
	}
}

// BenchmarkLearn is the cost of learning one observation (TTFT and TPOT),
// off the request path.
func BenchmarkLearn(b *testing.B) {
	for _, method := range Methods {
		b.Run(method, func(b *testing.B) {
			p, err := New(Options{Synchronous: true, Method: method})
			if err != nil {
				b.Fatal(err)
			}
			p.AddEndpoint("a", "")
			w := &world{rng: rand.New(rand.NewPCG(2, 2)), slow: 1, noise: 0.1}
			samples := make([]Sample, 1024)
			for i := range samples {
				in := w.input()
				ttft, tpot := w.truth(in)
				samples[i] = Sample{Endpoint: "a", Input: in, TTFTMs: ttft, TPOTMs: tpot, HasTTFT: true, HasTPOT: true}
			}
			b.ResetTimer()
			cpu := testkit.CPUTime()
			for i := range b.N {
				p.Observe(samples[i%len(samples)])
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/1e3, "µs/observation")
			b.ReportMetric(float64((testkit.CPUTime()-cpu).Nanoseconds())/float64(b.N)/1e3, "cpu-µs/observation")
		})
	}
}
