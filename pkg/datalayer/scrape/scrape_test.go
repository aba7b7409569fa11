package scrape

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/testkit"
)

func vllmPage(t testing.TB) string {
	t.Helper()
	b, err := os.ReadFile("testdata/vllm-metrics.txt")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestParseMetricsReadsAVLLMPage(t *testing.T) {
	t.Parallel()
	m, err := ParseMetrics([]byte(vllmPage(t)), DefaultMetricNames)
	if err != nil {
		t.Fatal(err)
	}
	want := datalayer.Metrics{
		WaitingQueueSize: 5, RunningRequests: 3, KVCacheUsage: 0.4213,
		ActiveLoRAs: []string{"sql-lora", "chat-lora"}, WaitingLoRAs: []string{"summarise-lora"}, MaxLoRAs: 4,
		BlockSize: 16, NumGPUBlocks: 27153,
	}
	if !sameMetrics(m, want) {
		t.Fatalf("got %+v\nwant %+v", m, want)
	}
}

func sameMetrics(a, b datalayer.Metrics) bool {
	return a.WaitingQueueSize == b.WaitingQueueSize && a.RunningRequests == b.RunningRequests &&
		a.KVCacheUsage == b.KVCacheUsage && slices.Equal(a.ActiveLoRAs, b.ActiveLoRAs) &&
		slices.Equal(a.WaitingLoRAs, b.WaitingLoRAs) && a.MaxLoRAs == b.MaxLoRAs &&
		a.BlockSize == b.BlockSize && a.NumGPUBlocks == b.NumGPUBlocks
}

const minimalPage = `vllm:num_requests_waiting 1
vllm:num_requests_running 2
vllm:kv_cache_usage_perc 0.5
`

func TestParseMetrics(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		page  string
		names MetricNames
		want  datalayer.Metrics
		is    error
	}{
		{
			name: "a data-parallel server's engines are summed, and their cache usage averaged",
			page: `# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 2
vllm:num_requests_waiting{engine="1",model_name="m"} 3
vllm:num_requests_running{engine="0",model_name="m"} 1
vllm:num_requests_running{engine="1",model_name="m"} 4
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.2
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.6
`,
			want: datalayer.Metrics{WaitingQueueSize: 5, RunningRequests: 5, KVCacheUsage: 0.4},
		},
		{
			name: "a data-parallel server's cache config names each rank's engine",
			page: minimalPage + `vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="100"} 1
vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="100"} 1
vllm:cache_config_info{block_size="16",engine="2",num_gpu_blocks="100"} 1
`,
			want: datalayer.Metrics{WaitingQueueSize: 1, RunningRequests: 2, KVCacheUsage: 0.5, BlockSize: 16, NumGPUBlocks: 100, DataParallelRanks: 3},
		},
		{
			name: "the cache config before the engine sized its cache leaves the block count unknown",
			page: minimalPage + `vllm:cache_config_info{block_size="32",num_gpu_blocks="None"} 1` + "\n",
			want: datalayer.Metrics{WaitingQueueSize: 1, RunningRequests: 2, KVCacheUsage: 0.5, BlockSize: 32},
		},
		{
			name: "the LoRA series with the latest timestamp wins, whatever its order",
			page: minimalPage + `vllm:lora_requests_info{max_lora="2",running_lora_adapters="new",waiting_lora_adapters=""} 200
vllm:lora_requests_info{max_lora="1",running_lora_adapters="old",waiting_lora_adapters="x, y"} 100
`,
			want: datalayer.Metrics{WaitingQueueSize: 1, RunningRequests: 2, KVCacheUsage: 0.5, ActiveLoRAs: []string{"new"}, MaxLoRAs: 2},
		},
		{
			name:  "another engine's names can be configured",
			page:  "sglang:num_queue_reqs 7\nsglang:num_running_reqs 8\nsglang:token_usage 0.25\n",
			names: MetricNames{Waiting: "sglang:num_queue_reqs", Running: "sglang:num_running_reqs", KVCacheUsage: "sglang:token_usage"},
			want:  datalayer.Metrics{WaitingQueueSize: 7, RunningRequests: 8, KVCacheUsage: 0.25},
		},
		{
			name: "a page without the queue is unknown load, not an empty queue",
			page: "vllm:num_requests_running 2\nvllm:kv_cache_usage_perc 0.5\n",
			is:   ErrMetricMissing,
		},
		{
			name: "an empty page is missing every metric",
			page: "",
			is:   ErrMetricMissing,
		},
		{
			name: "a negative queue is impossible",
			page: strings.Replace(minimalPage, "waiting 1", "waiting -1", 1),
			is:   ErrMetricValue,
		},
		{
			name: "a NaN cache usage is impossible",
			page: strings.Replace(minimalPage, "0.5", "NaN", 1),
			is:   ErrMetricValue,
		},
		{
			name: "a queue beyond any real server is impossible",
			page: strings.Replace(minimalPage, "waiting 1", "waiting 1e300", 1),
			is:   ErrMetricValue,
		},
		{
			name: "a histogram under a load metric's name gives no queue",
			page: "# TYPE vllm:num_requests_waiting histogram\nvllm:num_requests_waiting_bucket{le=\"+Inf\"} 1\nvllm:num_requests_waiting_count 1\nvllm:num_requests_waiting_sum 1\nvllm:num_requests_running 2\nvllm:kv_cache_usage_perc 0.5\n",
			is:   ErrMetricMissing,
		},
		{
			name: "garbage in a load metric's line is a parse error",
			page: "vllm:num_requests_waiting{engine=0} 1\nvllm:num_requests_running 2\nvllm:kv_cache_usage_perc 0.5\n",
			is:   ErrMetricsParse,
		},
		{
			name: "a page cut inside a load metric's line is a parse error",
			page: minimalPage[:len(minimalPage)-5],
			is:   ErrMetricsParse,
		},
		{
			name: "a summary under a load metric's name is refused",
			page: "# TYPE vllm:num_requests_waiting summary\nvllm:num_requests_waiting{quantile=\"0.5\"} 1\nvllm:num_requests_running 2\nvllm:kv_cache_usage_perc 0.5\n",
			is:   ErrMetricValue,
		},
		{
			name: "HTML is not a metrics page",
			page: "<html><body>502 Bad Gateway</body></html>\n",
			is:   ErrMetricMissing,
		},
		{
			name: "garbage in other metrics' lines does not matter",
			page: "python_gc{{{ garbage\n# TYPE x summary\n" + minimalPage,
			want: datalayer.Metrics{WaitingQueueSize: 1, RunningRequests: 2, KVCacheUsage: 0.5},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			names := tt.names
			if names == (MetricNames{}) {
				names = DefaultMetricNames
			}
			m, err := ParseMetrics([]byte(tt.page), names)
			if tt.is != nil {
				if !errors.Is(err, tt.is) {
					t.Fatalf("error = %v, want %v", err, tt.is)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !sameMetrics(m, tt.want) {
				t.Fatalf("got %+v\nwant %+v", m, tt.want)
			}
		})
	}
}

func FuzzParseMetrics(f *testing.F) {
	f.Add([]byte(vllmPage(f)))
	f.Add([]byte(minimalPage))
	f.Add([]byte(minimalPage + `vllm:cache_config_info{block_size="16",engine="0"} 1` + "\n" + `vllm:cache_config_info{block_size="16",engine="1"} 1` + "\n"))
	f.Add([]byte(minimalPage + `vllm:lora_requests_info{max_lora="2",running_lora_adapters="a,b",waiting_lora_adapters=""} 200` + "\n"))
	f.Add([]byte(`{"vllm:num_requests_waiting", engine="0"} 1` + "\n"))
	f.Add([]byte("# TYPE vllm:num_requests_waiting histogram\nvllm:num_requests_waiting_bucket{le=\"+Inf\"} 1\n"))
	f.Add([]byte("vllm:num_requests_waiting 1 1700000000000\n"))
	f.Fuzz(func(t *testing.T, page []byte) {
		m, err := ParseMetrics(page, DefaultMetricNames)
		if err != nil {
			for _, known := range []error{ErrMetricsParse, ErrMetricMissing, ErrMetricValue} {
				if errors.Is(err, known) {
					return
				}
			}
			t.Fatalf("error %v is none of the sentinels", err)
		}
		if m.WaitingQueueSize < 0 || m.RunningRequests < 0 || !(m.KVCacheUsage >= 0 && m.KVCacheUsage <= 1) ||
			m.MaxLoRAs < 0 || m.BlockSize < 0 || m.NumGPUBlocks < 0 {
			t.Fatalf("accepted impossible metrics %+v", m)
		}
	})
}

// metricsServer is a model server's /metrics on loopback whose behaviour
// the test switches.
type metricsServer struct {
	*httptest.Server
	mode     atomic.Value // string
	page     atomic.Value // string
	requests atomic.Int64
}

func newMetricsServer(t *testing.T, page string) *metricsServer {
	s := &metricsServer{}
	s.mode.Store("ok")
	s.page.Store(page)
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.requests.Add(1)
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		page := s.page.Load().(string)
		switch s.mode.Load().(string) {
		case "ok":
			w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
			_, _ = w.Write([]byte(page))
		case "500":
			http.Error(w, "engine dead", http.StatusInternalServerError)
		case "garbage":
			_, _ = w.Write([]byte("vllm:num_requests_waiting{{{\x00\xff"))
		case "hang":
			<-r.Context().Done()
		case "truncated":
			// Promise the whole page, send half, and drop the connection.
			w.Header().Set("Content-Length", "100000")
			_, _ = w.Write([]byte(page[:len(page)/2]))
		}
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *metricsServer) addr() string { return strings.TrimPrefix(s.URL, "http://") }

// issuedRequests records, per host, when a client starts each request. A
// test server counts a request only when it reads it, which can be after
// the scrape that sent it was cancelled; what the scraper issued is known
// exactly once the loop that issued it has returned.
type issuedRequests struct {
	next http.RoundTripper
	mu   sync.Mutex
	at   map[string][]time.Time
}

func newIssuedRequests() *issuedRequests {
	return &issuedRequests{next: http.DefaultTransport.(*http.Transport).Clone(), at: map[string][]time.Time{}}
}

func (c *issuedRequests) RoundTrip(r *http.Request) (*http.Response, error) {
	c.mu.Lock()
	c.at[r.URL.Host] = append(c.at[r.URL.Host], time.Now())
	c.mu.Unlock()
	return c.next.RoundTrip(r)
}

// to is how many requests host has been sent.
func (c *issuedRequests) to(host string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.at[host])
}

func TestScraper(t *testing.T) {
	t.Parallel()
	a := newMetricsServer(t, vllmPage(t))
	b := newMetricsServer(t, minimalPage)
	ds := datalayer.NewDatastore(nil)
	ds.Upsert(ep("a", a.addr()))
	ds.Upsert(ep("b", b.addr()))
	reg := prometheus.NewRegistry()
	logs := &testkit.LogBuffer{}
	issued := newIssuedRequests()
	s := New(ds, Options{
		Interval: 2 * time.Millisecond,
		// Long enough that a's good scrapes do not time out on a loaded
		// machine, which would log failure streaks of their own.
		Timeout:    300 * time.Millisecond,
		Logger:     slog.New(slog.NewTextHandler(logs, nil)),
		HTTPClient: &http.Client{Transport: issued},
	}, reg)
	ctx, cancel := context.WithCancel(t.Context())
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		s.Run(ctx)
	}()

	metricsOf := func(name string) datalayer.Metrics {
		m, _ := ds.Metrics(name)
		return m
	}
	testkit.WaitFor(t, "both endpoints scraped", func() error {
		if seen := metricsOf("a").WaitingQueueSize; seen != 5 {
			return fmt.Errorf("metricsOf(\"a\").WaitingQueueSize is %v, want %v", seen, 5)
		}
		if seen := metricsOf("b").WaitingQueueSize; seen != 1 {
			return fmt.Errorf("metricsOf(\"b\").WaitingQueueSize is %v, want %v", seen, 1)
		}
		return nil
	})
	if m := metricsOf("a"); m.NumGPUBlocks != 27153 || m.UpdateTime.IsZero() {
		t.Fatalf("a's metrics = %+v", m)
	}

	for _, tc := range []struct{ mode, reason string }{
		{"500", "status"},
		{"garbage", "parse"},
		{"hang", "timeout"},
		{"truncated", "read"},
	} {
		errs := s.errors.WithLabelValues(tc.reason)
		before := testutil.ToFloat64(errs)
		a.mode.Store(tc.mode)
		// Waited for by a's own requests, not the error counter, which b's
		// timeouts on a loaded machine also raise. Every request issued
		// from here on meets the new mode, and one loop scrapes a, one
		// scrape at a time: once the second is issued, the first's failure
		// has been handled, and nothing can refresh a's metrics.
		n := issued.to(a.addr())
		testkit.WaitFor(t, "a scraped twice in mode "+tc.mode, func() error {
			if seen := issued.to(a.addr()); seen < n+2 {
				return fmt.Errorf("issued.to(a.addr()) is %v, want >= %v", seen, n+2)
			}
			return nil
		})
		if got := testutil.ToFloat64(errs); got < before+1 {
			t.Fatalf("%s: errors with reason %s = %v, want at least %v", tc.mode, tc.reason, got, before+1)
		}
		// The last good metrics stay, and stop being refreshed.
		last := metricsOf("a").UpdateTime
		testkit.WaitFor(t, "two more failures", func() error {
			if seen := issued.to(a.addr()); seen < n+4 {
				return fmt.Errorf("issued.to(a.addr()) is %v, want >= %v", seen, n+4)
			}
			return nil
		})
		if m := metricsOf("a"); !m.UpdateTime.Equal(last) || m.WaitingQueueSize != 5 {
			t.Fatalf("%s: metrics changed while failing: %+v", tc.mode, m)
		}
		if m := metricsOf("a"); m.Fresh(last.Add(time.Second), 500*time.Millisecond) {
			t.Fatalf("%s: metrics a second old still fresh", tc.mode)
		}
		a.mode.Store("ok")
		testkit.WaitFor(t, "recovery from "+tc.mode, func() error {
			if !(metricsOf("a").UpdateTime.After(last)) {
				return errors.New("metricsOf(\"a\").UpdateTime.After(last) is false")
			}
			return nil
		})
	}
	// Each of a's failure streaks is logged once, not once per scrape. (b
	// is left out: on a loaded machine its scrapes may time out too.)
	if n := countLines(logs.String(), "scrape failed", "endpoint=a "); n != 4 {
		t.Errorf("failure lines logged for a = %d, want one per streak (4):\n%s", n, logs.String())
	}
	if n := countLines(logs.String(), "scrape recovered", "endpoint=a "); n != 4 {
		t.Errorf("recovery lines logged for a = %d, want 4:\n%s", n, logs.String())
	}

	// A changed page is seen.
	b.page.Store(strings.Replace(minimalPage, "waiting 1", "waiting 9", 1))
	testkit.WaitFor(t, "b's new queue", func() error {
		if seen := metricsOf("b").WaitingQueueSize; seen != 9 {
			return fmt.Errorf("metricsOf(\"b\").WaitingQueueSize is %v, want %v", seen, 9)
		}
		return nil
	})

	// An endpoint that leaves is no longer scraped: once the target count
	// drops, its goroutine has returned, so every request it will ever have
	// issued has been issued. (b's server may still read one of them later:
	// a scrape cancelled on the wire is still a request that was sent.)
	ds.Remove("b")
	testkit.WaitFor(t, "b's scraper to stop", func() error {
		if seen := testutil.ToFloat64(s.targets); seen != 1 {
			return fmt.Errorf("testutil.ToFloat64(s.targets) is %v, want %v", seen, 1)
		}
		return nil
	})
	bIssued := issued.to(b.addr())
	aIssued := issued.to(a.addr())
	testkit.WaitFor(t, "more scrapes of a", func() error {
		if seen := issued.to(a.addr()); seen < aIssued+3 {
			return fmt.Errorf("issued.to(a.addr()) is %v, want >= %v", seen, aIssued+3)
		}
		return nil
	})
	if got := issued.to(b.addr()); got != bIssued {
		t.Fatalf("b scraped %d more times after removal", got-bIssued)
	}

	// An endpoint that joins is scraped.
	c := newMetricsServer(t, minimalPage)
	ds.Upsert(ep("c", c.addr()))
	testkit.WaitFor(t, "c scraped", func() error {
		if seen := metricsOf("c").RunningRequests; seen != 2 {
			return fmt.Errorf("metricsOf(\"c\").RunningRequests is %v, want %v", seen, 2)
		}
		return nil
	})

	cancel()
	<-stopped
	if got := testutil.ToFloat64(s.targets); got != 0 {
		t.Fatalf("targets after shutdown = %v", got)
	}
	// Run waits for every scrape loop it started, so nothing of it is left.
}

// Endpoints that join together are scraped at once, and from then on each
// in a phase of its own: their second scrapes spread over the interval
// instead of coming in one burst (with every loop on the same ticker, all
// sixteen would land within the scheduler's jitter of one another).
func TestScrapersOfEndpointsThatJoinTogetherKeepPhasesApart(t *testing.T) {
	t.Parallel()
	const endpoints, interval = 16, 400 * time.Millisecond
	ds := datalayer.NewDatastore(nil)
	for i := range endpoints {
		ds.Upsert(ep(fmt.Sprintf("e%d", i), newMetricsServer(t, minimalPage).addr()))
	}
	times := newIssuedRequests()
	s := New(ds, Options{Interval: interval, Timeout: time.Second, HTTPClient: &http.Client{Transport: times}}, prometheus.NewRegistry())
	ctx, cancel := context.WithCancel(t.Context())
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		s.Run(ctx)
	}()
	defer func() { cancel(); <-stopped }()
	var seconds []time.Duration
	testkit.WaitFor(t, "every endpoint scraped twice", func() error {
		times.mu.Lock()
		defer times.mu.Unlock()
		if len(times.at) < endpoints {
			return fmt.Errorf("%d of %d endpoints scraped", len(times.at), endpoints)
		}
		seconds = seconds[:0]
		for _, at := range times.at {
			if len(at) < 2 {
				return fmt.Errorf("an endpoint scraped %d times", len(at))
			}
			seconds = append(seconds, at[1].Sub(at[0]))
		}
		return nil
	})
	lo, hi := slices.Min(seconds), slices.Max(seconds)
	// Sixteen phases drawn uniformly from the interval all fall within a
	// quarter of it with probability about 16·(1/4)^15, below 1e-8.
	if hi-lo < interval/4 {
		t.Fatalf("second scrapes %v to %v after the first: within %v of each other, not spread over the %v interval", lo, hi, hi-lo, interval)
	}
	if hi > 2*interval {
		t.Fatalf("a second scrape came %v after the first, with a %v interval", hi, interval)
	}
}

func TestScraperRefusesAnOversizedPage(t *testing.T) {
	t.Parallel()
	const limit = 64 << 10
	huge := strings.Repeat("# padding line that no parser needs to read\n", limit/40) + minimalPage
	srv := newMetricsServer(t, huge)
	ds := datalayer.NewDatastore(nil)
	ds.Upsert(ep("a", srv.addr()))
	s := New(ds, Options{Interval: 5 * time.Millisecond, MaxPageBytes: limit, Logger: slog.New(slog.DiscardHandler)}, nil)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go s.Run(ctx)
	testkit.WaitFor(t, "the oversized page to be refused", func() error {
		if seen := testutil.ToFloat64(s.errors.WithLabelValues("too_large")); seen < 1 {
			return fmt.Errorf("testutil.ToFloat64(s.errors.WithLabelValues(\"too_large\")) is %v, want >= %v", seen, 1)
		}
		return nil
	})
	if m, _ := ds.Metrics("a"); !m.UpdateTime.IsZero() {
		t.Fatalf("metrics stored from an oversized page: %+v", m)
	}
}

func BenchmarkParseMetrics(b *testing.B) {
	page := []byte(vllmPage(b))
	for b.Loop() {
		if _, err := ParseMetrics(page, DefaultMetricNames); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/page")
	b.SetBytes(int64(len(page)))
}

// countLines counts the lines of text that contain every one of subs.
func countLines(text string, subs ...string) int {
	n := 0
	for _, line := range strings.Split(text, "\n") {
		all := true
		for _, s := range subs {
			all = all && strings.Contains(line, s)
		}
		if all {
			n++
		}
	}
	return n
}

func ep(name, addr string) *datalayer.Endpoint {
	return &datalayer.Endpoint{Name: name, Address: addr, Pod: name, Model: "m"}
}

// landedWaker counts kicks and, at each, whether the endpoint's metrics
// were already stored: a waiter woken before the store would check its
// release against the old ones.
type landedWaker struct {
	ds                 *datalayer.Datastore
	kicks, beforeStore atomic.Int64
}

func (w *landedWaker) Kick() {
	w.kicks.Add(1)
	if m, ok := w.ds.Metrics("a"); !ok || m.UpdateTime.IsZero() {
		w.beforeStore.Add(1)
	}
}

func TestScraperTellsItsWakerWhenMetricsLandAndOnlyThen(t *testing.T) {
	t.Parallel()
	srv := newMetricsServer(t, minimalPage)
	srv.mode.Store("500")
	ds := datalayer.NewDatastore(nil)
	ds.Upsert(ep("a", srv.addr()))
	w := &landedWaker{ds: ds}
	s := New(ds, Options{Interval: 5 * time.Millisecond, Logger: slog.New(slog.DiscardHandler), Landed: w}, nil)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go s.Run(ctx)
	testkit.WaitFor(t, "three failed scrapes", func() error {
		if n := testutil.ToFloat64(s.errors.WithLabelValues("status")); n < 3 {
			return fmt.Errorf("%v failed scrapes, want at least 3", n)
		}
		return nil
	})
	if n := w.kicks.Load(); n != 0 {
		t.Fatalf("%d kicks while every scrape failed, want none", n)
	}
	srv.mode.Store("ok")
	testkit.WaitFor(t, "two kicks once scrapes succeed", func() error {
		if n := w.kicks.Load(); n < 2 {
			return fmt.Errorf("%d kicks, want at least 2", n)
		}
		return nil
	})
	if n := w.beforeStore.Load(); n != 0 {
		t.Fatalf("%d kicks came before the metrics were stored", n)
	}
}
