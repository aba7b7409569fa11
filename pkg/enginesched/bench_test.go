package enginesched

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkReplay is the cost of one replay, which the EPP runs at each
// change to an endpoint's requests in flight (a request sent, its first
// token, every fourth token, its end), on the response path. The batch
// is full (the seats' decodes are waited out), and the queue's prefills
// are chunked.
func BenchmarkReplay(b *testing.B) {
	for _, queued := range []int{4, 64} {
		b.Run(fmt.Sprintf("seats=16/queued=%d", queued), func(b *testing.B) {
			var seqs []Seq
			for i := range 16 {
				seqs = append(seqs, Seq{Context: 2000 + 100*i, Outputs: 10 + 17*i})
			}
			for i := range queued {
				seqs = append(seqs, Seq{Prefill: 300 + 97*i, Context: 3000, Outputs: 64})
			}
			var r Replayer
			b.ReportAllocs()
			start := time.Now()
			for b.Loop() {
				r.Replay(seqs, Limits{MaxNumSeqs: 16, MaxBatchedTokens: 4096})
			}
			b.ReportMetric(float64(time.Since(start).Nanoseconds())/float64(b.N)/1e3, "µs/replay")
		})
	}
}
