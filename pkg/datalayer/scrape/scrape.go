package scrape

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kvroute/kvroute/pkg/datalayer"
)

// Errors from scraping an endpoint's metrics, for errors.Is.
var (
	// ErrMetricsParse marks a metrics page that is not valid Prometheus text.
	ErrMetricsParse = errors.New("malformed metrics page")
	// ErrMetricMissing marks a page without one of the load metrics. A
	// missing queue is unknown load, not an empty queue: reading it as zero
	// would send traffic to the endpoint that reports least.
	ErrMetricMissing = errors.New("metric missing from page")
	// ErrMetricValue marks a load metric whose value is impossible
	// (negative, NaN, infinite, or beyond any real server).
	ErrMetricValue = errors.New("impossible metric value")
	// ErrScrapeStatus marks a metrics response whose status is not 200.
	ErrScrapeStatus = errors.New("metrics endpoint answered with an error status")
	// ErrMetricsTooLarge marks a metrics page beyond ScrapeOptions.MaxPageBytes.
	ErrMetricsTooLarge = errors.New("metrics page too large")
)

// errScrapeRead marks a response cut short (the connection dropped, or
// fewer bytes than promised).
var errScrapeRead = errors.New("read metrics page")

// DefaultMaxPageBytes bounds a scraped page; vLLM's is a few hundred kB.
const DefaultMaxPageBytes = 16 << 20

// MetricNames are the model server's metric names the scraper reads.
type MetricNames struct {
	// Waiting, Running and KVCacheUsage are required on every page.
	Waiting      string
	Running      string
	KVCacheUsage string
	// LoRAInfo and CacheConfig are read when present.
	LoRAInfo    string
	CacheConfig string
}

// DefaultMetricNames are vLLM's.
var DefaultMetricNames = MetricNames{
	Waiting:      "vllm:num_requests_waiting",
	Running:      "vllm:num_requests_running",
	KVCacheUsage: "vllm:kv_cache_usage_perc",
	LoRAInfo:     "vllm:lora_requests_info",
	CacheConfig:  "vllm:cache_config_info",
}

// ScrapeOptions configure a Scraper; the zero value scrapes vLLM over plain
// HTTP every 50ms.
type Options struct {
	// Interval between scrapes of one endpoint; 50ms when zero.
	Interval time.Duration
	// Timeout of one scrape; 1s when zero. A slow endpoint is scraped less
	// often rather than concurrently with itself.
	Timeout time.Duration
	// Path of the metrics page; "/metrics" when empty.
	Path string
	// Scheme is "http" (when empty) or "https".
	Scheme string
	// MetricNames override DefaultMetricNames field by field.
	MetricNames MetricNames
	// MaxPageBytes bounds a metrics page; DefaultMaxPageBytes when zero.
	MaxPageBytes int64
	// HTTPClient makes the requests; a client keeping one idle connection per
	// endpoint when nil.
	HTTPClient *http.Client
	// Logger receives scrape failures, rate-limited per endpoint;
	// slog.Default when nil.
	Logger *slog.Logger
	// Landed, when set, is told each time an endpoint's fresh metrics are
	// stored: a flow controller checks its waiting requests' release
	// against them then, not at its next recheck.
	Landed Waker
}

// Waker is told that something a waiter depends on changed; the flow
// controller (*flowcontrol.Controller) is one. Kick must not block.
type Waker interface{ Kick() }

func (o Options) withDefaults() Options {
	if o.Interval <= 0 {
		o.Interval = 50 * time.Millisecond
	}
	if o.Timeout <= 0 {
		o.Timeout = time.Second
	}
	if o.Path == "" {
		o.Path = "/metrics"
	}
	if !strings.HasPrefix(o.Path, "/") {
		o.Path = "/" + o.Path
	}
	if o.MaxPageBytes <= 0 {
		o.MaxPageBytes = DefaultMaxPageBytes
	}
	if o.Scheme == "" {
		o.Scheme = "http"
	}
	n, d := &o.MetricNames, DefaultMetricNames
	for _, f := range []struct {
		v   *string
		def string
	}{
		{&n.Waiting, d.Waiting}, {&n.Running, d.Running}, {&n.KVCacheUsage, d.KVCacheUsage},
		{&n.LoRAInfo, d.LoRAInfo}, {&n.CacheConfig, d.CacheConfig},
	} {
		if *f.v == "" {
			*f.v = f.def
		}
	}
	if o.HTTPClient == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.MaxIdleConnsPerHost = 1
		t.Proxy = nil
		o.HTTPClient = &http.Client{Transport: t}
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// Scraper polls every endpoint of a datastore for its load metrics and
// stores them there. An endpoint that fails keeps its last metrics, whose
// UpdateTime then ages, so consumers see them go stale (Metrics.Fresh).
type Scraper struct {
	ds   *datalayer.Datastore
	opts Options

	errors   *prometheus.CounterVec
	duration prometheus.Histogram
	targets  prometheus.Gauge
}

// NewScraper returns a scraper of ds's endpoints. Its metrics are registered
// with reg unless reg is nil.
func New(ds *datalayer.Datastore, opts Options, reg prometheus.Registerer) *Scraper {
	s := &Scraper{
		ds:   ds,
		opts: opts.withDefaults(),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_scrape_errors_total",
			Help: "Failed endpoint metrics scrapes, by reason (connect, timeout, status, read, too_large, parse, missing, value).",
		}, []string{"reason"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kvroute_scrape_duration_seconds",
			Help:    "Time to fetch and parse one endpoint's metrics page.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1},
		}),
		targets: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvroute_scrape_targets",
			Help: "Endpoints being scraped.",
		}),
	}
	if reg != nil {
		reg.MustRegister(s.errors, s.duration, s.targets)
	}
	return s
}

// Run scrapes until ctx is done, one goroutine per endpoint, started and
// stopped as endpoints join and leave the datastore. It returns after every
// goroutine it started has stopped.
func (s *Scraper) Run(ctx context.Context) {
	changed := make(chan struct{}, 1)
	unsubscribe := s.ds.OnChange(func(_, _ []*datalayer.Endpoint) {
		select {
		case changed <- struct{}{}:
		default:
		}
	})
	defer unsubscribe()

	type target struct {
		ep     *datalayer.Endpoint
		cancel context.CancelFunc
		done   chan struct{}
	}
	targets := map[string]*target{}
	stop := func(name string, t *target) {
		t.cancel()
		<-t.done
		delete(targets, name)
	}
	defer func() {
		for _, t := range targets {
			t.cancel()
		}
		for _, t := range targets {
			<-t.done
		}
	}()
	for {
		current := s.ds.List()
		seen := make(map[string]bool, len(current))
		for _, ep := range current {
			seen[ep.Name] = true
			if t, ok := targets[ep.Name]; ok {
				if t.ep.Address == ep.Address {
					t.ep = ep
					continue
				}
				stop(ep.Name, t)
			}
			tctx, cancel := context.WithCancel(ctx)
			t := &target{ep: ep, cancel: cancel, done: make(chan struct{})}
			targets[ep.Name] = t
			go func() {
				defer close(t.done)
				s.scrapeLoop(tctx, ep)
			}()
		}
		for name, t := range targets {
			if !seen[name] {
				stop(name, t)
			}
		}
		s.targets.Set(float64(len(targets)))
		select {
		case <-ctx.Done():
			s.targets.Set(0)
			return
		case <-changed:
		}
	}
}

// scrapeLoop scrapes one endpoint until ctx is done.
func (s *Scraper) scrapeLoop(ctx context.Context, ep *datalayer.Endpoint) {
	url := s.opts.Scheme + "://" + ep.Address + s.opts.Path
	var (
		buf        bytes.Buffer
		failing    bool
		lastLog    time.Time
		suppressed int
	)
	// The first scrape is at once, so that an endpoint has metrics soon
	// after it joins; the rest keep a phase of the endpoint's own, from a
	// random part of the interval after it, so that endpoints that joined
	// together (a pool's pods when the EPP starts) do not all scrape in
	// the same instant ever after: a burst of every page at once, each
	// interval, that the requests arriving then would wait behind.
	next := time.NewTimer(rand.N(s.opts.Interval))
	defer next.Stop()
	for {
		start := time.Now()
		m, err := s.scrapeOnce(ctx, url, &buf)
		if ctx.Err() != nil {
			// Stopped mid-scrape: the endpoint left, and its answer with it.
			return
		}
		s.duration.Observe(time.Since(start).Seconds())
		if err == nil {
			m.UpdateTime = time.Now()
			s.ds.SetMetricsAt(ep.Name, ep.Address, m)
			if s.opts.Landed != nil {
				s.opts.Landed.Kick()
			}
			if failing {
				s.opts.Logger.Info("endpoint metrics scrape recovered", "endpoint", ep.Name, "address", ep.Address)
				failing, suppressed = false, 0
			}
		} else {
			s.errors.WithLabelValues(scrapeReason(err)).Inc()
			// One line when an endpoint starts failing, then one per
			// scrapeLogEvery while it keeps failing: at 50ms a dead endpoint
			// would otherwise write twenty lines a second.
			if !failing || time.Since(lastLog) >= scrapeLogEvery {
				s.opts.Logger.Warn("endpoint metrics scrape failed; keeping its last metrics",
					"endpoint", ep.Name, "url", url, "error", err, "failures_not_logged", suppressed)
				lastLog, suppressed = time.Now(), 0
			} else {
				suppressed++
			}
			failing = true
		}
		select {
		case <-ctx.Done():
			return
		case <-next.C:
			// Set again as it fires, before the scrape, so that the
			// interval runs from tick to tick as a ticker's does.
			next.Reset(s.opts.Interval)
		}
	}
}

const scrapeLogEvery = 30 * time.Second

func (s *Scraper) scrapeOnce(ctx context.Context, url string, buf *bytes.Buffer) (datalayer.Metrics, error) {
	ctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return datalayer.Metrics{}, fmt.Errorf("scrape %s: %w", url, err)
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := s.opts.HTTPClient.Do(req)
	if err != nil {
		return datalayer.Metrics{}, fmt.Errorf("scrape %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		return datalayer.Metrics{}, fmt.Errorf("scrape %s: %w: %s", url, ErrScrapeStatus, resp.Status)
	}
	buf.Reset()
	limit := s.opts.MaxPageBytes
	n, err := buf.ReadFrom(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return datalayer.Metrics{}, fmt.Errorf("scrape %s: %w: %w", url, errScrapeRead, err)
	}
	if n > limit {
		return datalayer.Metrics{}, fmt.Errorf("scrape %s: %w (over %d bytes)", url, ErrMetricsTooLarge, limit)
	}
	m, err := ParseMetrics(buf.Bytes(), s.opts.MetricNames)
	if err != nil {
		return datalayer.Metrics{}, fmt.Errorf("scrape %s: %w", url, err)
	}
	return m, nil
}

func scrapeReason(err error) string {
	var netErr net.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &netErr) && netErr.Timeout()):
		return "timeout"
	case errors.Is(err, ErrScrapeStatus):
		return "status"
	case errors.Is(err, ErrMetricsTooLarge):
		return "too_large"
	case errors.Is(err, ErrMetricsParse):
		return "parse"
	case errors.Is(err, ErrMetricMissing):
		return "missing"
	case errors.Is(err, ErrMetricValue):
		return "value"
	case errors.Is(err, errScrapeRead):
		return "read"
	}
	return "connect"
}

// ParseMetrics reads the load metrics named by names from a Prometheus text
// page. Only the lines of those metrics are parsed, so the page's many
// histograms cost a line scan, not a parse. A load metric with several
// series (one per engine of a data-parallel server) is summed, except the KV
// cache usage, which is averaged over the engines.
func ParseMetrics(page []byte, names MetricNames) (datalayer.Metrics, error) {
	want := [...]string{names.Waiting, names.Running, names.KVCacheUsage, names.LoRAInfo, names.CacheConfig}
	filtered := filterMetricLines(page, want[:])
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(bytes.NewReader(filtered))
	if err != nil {
		return datalayer.Metrics{}, fmt.Errorf("%w: %w", ErrMetricsParse, err)
	}
	var m datalayer.Metrics
	var errs []error
	count := func(name string) int {
		v, _, err := sumSeries(families[name], name)
		if err == nil && v > math.MaxInt32 {
			err = fmt.Errorf("%w: %s is %v", ErrMetricValue, name, v)
		}
		if err != nil {
			errs = append(errs, err)
			return 0
		}
		return int(v)
	}
	m.WaitingQueueSize = count(names.Waiting)
	m.RunningRequests = count(names.Running)
	if v, n, err := sumSeries(families[names.KVCacheUsage], names.KVCacheUsage); err != nil {
		errs = append(errs, err)
	} else {
		m.KVCacheUsage = min(v/float64(n), 1)
	}
	if len(errs) > 0 {
		return datalayer.Metrics{}, errors.Join(errs...)
	}
	if mf := families[names.LoRAInfo]; mf != nil {
		readLoRAInfo(mf, &m)
	}
	if mf := families[names.CacheConfig]; mf != nil && len(mf.GetMetric()) > 0 {
		labels := labelMap(mf.GetMetric()[0])
		m.BlockSize = parseCount(labels["block_size"])
		m.NumGPUBlocks = parseCount(labels["num_gpu_blocks"])
		m.DataParallelRanks = countEngines(mf)
	}
	return m, nil
}

// countEngines counts the distinct engine label values of a metric's
// series: a data-parallel server reports one series per rank.
func countEngines(mf *dto.MetricFamily) int {
	seen := map[string]bool{}
	for _, m := range mf.GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "engine" {
				seen[l.GetValue()] = true
			}
		}
	}
	return len(seen)
}

// filterMetricLines keeps the sample, HELP and TYPE lines of the wanted
// metrics. Quoted-name lines (`{"name",...}`) are kept for the parser to
// sort out.
func filterMetricLines(page []byte, want []string) []byte {
	out := make([]byte, 0, 1024)
	for len(page) > 0 {
		line := page
		if i := bytes.IndexByte(page, '\n'); i >= 0 {
			line, page = page[:i+1], page[i+1:]
		} else {
			page = nil
		}
		if keepMetricLine(line, want) {
			out = append(out, line...)
		}
	}
	return out
}

func keepMetricLine(line []byte, want []string) bool {
	rest := bytes.TrimLeft(line, " \t")
	if len(rest) == 0 {
		return false
	}
	if rest[0] == '#' {
		f := bytes.Fields(rest[1:])
		if len(f) < 2 || (string(f[0]) != "HELP" && string(f[0]) != "TYPE") {
			return false
		}
		return wanted(f[1], want)
	}
	if rest[0] == '{' {
		return true
	}
	end := bytes.IndexAny(rest, "{ \t\n")
	if end < 0 {
		end = len(rest)
	}
	return wanted(rest[:end], want)
}

func wanted(name []byte, want []string) bool {
	for _, w := range want {
		if w != "" && string(name) == w {
			return true
		}
	}
	return false
}

// sumSeries sums a required metric's series and returns how many there were.
func sumSeries(mf *dto.MetricFamily, name string) (float64, int, error) {
	if mf == nil || len(mf.GetMetric()) == 0 {
		return 0, 0, fmt.Errorf("%w: %s", ErrMetricMissing, name)
	}
	var sum float64
	for _, s := range mf.GetMetric() {
		v, ok := sampleValue(s)
		if !ok {
			return 0, 0, fmt.Errorf("%w: %s is a %s, not a gauge or counter", ErrMetricValue, name, mf.GetType())
		}
		if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
			return 0, 0, fmt.Errorf("%w: %s is %v", ErrMetricValue, name, v)
		}
		sum += v
	}
	return sum, len(mf.GetMetric()), nil
}

func sampleValue(m *dto.Metric) (float64, bool) {
	switch {
	case m.Gauge != nil:
		return m.Gauge.GetValue(), true
	case m.Counter != nil:
		return m.Counter.GetValue(), true
	case m.Untyped != nil:
		return m.Untyped.GetValue(), true
	}
	return 0, false
}

// readLoRAInfo takes the series with the latest value: vLLM sets the value
// to the time the adapter set was observed, and an old series may linger.
func readLoRAInfo(mf *dto.MetricFamily, m *datalayer.Metrics) {
	var latest *dto.Metric
	best := math.Inf(-1)
	for _, s := range mf.GetMetric() {
		if v, ok := sampleValue(s); ok && v > best {
			latest, best = s, v
		}
	}
	if latest == nil {
		return
	}
	labels := labelMap(latest)
	m.ActiveLoRAs = splitAdapters(labels["running_lora_adapters"])
	m.WaitingLoRAs = splitAdapters(labels["waiting_lora_adapters"])
	m.MaxLoRAs = parseCount(labels["max_lora"])
}

func labelMap(m *dto.Metric) map[string]string {
	out := make(map[string]string, len(m.GetLabel()))
	for _, l := range m.GetLabel() {
		out[l.GetName()] = l.GetValue()
	}
	return out
}

func splitAdapters(s string) []string {
	var out []string
	for a := range strings.SplitSeq(s, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	return out
}

// parseCount reads a non-negative count label; anything else (vLLM writes
// "None" before the engine has sized its cache) is 0, unknown.
func parseCount(s string) int {
	n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 32)
	if err != nil || n < 0 {
		return 0
	}
	return int(n)
}
