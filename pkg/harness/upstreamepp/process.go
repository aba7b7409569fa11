package upstreamepp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// EPPOptions shape one upstream EPP process.
type EPPOptions struct {
	// Binary is the upstream EPP (default: Binary()).
	Binary string
	// Config is the configuration's text; ConfigDefault runs upstream's
	// built-in one (no --config-file).
	Config string
	// ConfigName names the configuration in the report (default "built-in
	// default" or "custom").
	ConfigName string
	// Name names the replica and its files (default "upstream-epp").
	Name string
	// OutDir receives <Name>.log, the process's output, and
	// <Name>.metrics, its /metrics at each stop (default: the cluster's
	// folder).
	OutDir string
	// Args are further flags, after the harness's own.
	Args []string
	// StartTimeout bounds each start's wait for readiness (default 60s).
	StartTimeout time.Duration
}

// EPP is one upstream EPP process, restartable on the same ports.
type EPP struct {
	cl     *Cluster
	opts   EPPOptions
	binary string
	args   []string
	ports  struct{ grpc, health, metrics int }
	health *grpc.ClientConn

	mu      sync.Mutex
	cmd     *exec.Cmd
	exited  chan struct{}
	waitErr error
	log     *os.File
	starts  int
}

// The flags every start passes besides ports, pool and configuration: a
// plaintext ext_proc server (the gateway speaks plaintext to it here),
// metrics without the API server's authorisation, no tracing exporter to
// reach, and the chart's log verbosity.
var fixedFlags = []string{"--secure-serving=false", "--metrics-endpoint-auth=false", "--tracing=false", "--v=1"}

// FixedFlags are the flags every start passes besides the pool's name and
// namespace, the three ports and --config-file.
func FixedFlags() []string { return append([]string(nil), fixedFlags...) }

// StartEPP starts the upstream EPP on the cluster's pool and waits until
// it is ready: its gRPC health serving and every pod of the pool in its
// datastore. Stop stops it.
func (cl *Cluster) StartEPP(ctx context.Context, opts EPPOptions) (*EPP, error) {
	if opts.Binary == "" {
		b, err := Binary()
		if err != nil {
			return nil, err
		}
		opts.Binary = b
	} else if err := checkBuild(opts.Binary); err != nil {
		return nil, err
	}
	if opts.Name == "" {
		opts.Name = "upstream-epp"
	}
	if opts.ConfigName == "" {
		opts.ConfigName = "built-in default"
		if opts.Config != ConfigDefault {
			opts.ConfigName = "custom"
		}
	}
	if opts.OutDir == "" {
		opts.OutDir = filepath.Dir(cl.kubeconfig)
	}
	if opts.StartTimeout <= 0 {
		opts.StartTimeout = 60 * time.Second
	}
	if err := os.MkdirAll(opts.OutDir, 0o755); err != nil {
		return nil, fmt.Errorf("upstreamepp: %w", err)
	}
	e := &EPP{cl: cl, opts: opts, binary: opts.Binary}
	ports, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	e.ports.grpc, e.ports.health, e.ports.metrics = ports[0], ports[1], ports[2]
	e.args = []string{
		"--pool-name=" + cl.Pool(), "--pool-namespace=" + cl.Namespace(),
		"--grpc-port=" + strconv.Itoa(e.ports.grpc),
		"--grpc-health-port=" + strconv.Itoa(e.ports.health),
		"--metrics-port=" + strconv.Itoa(e.ports.metrics),
	}
	e.args = append(e.args, fixedFlags...)
	if opts.Config != ConfigDefault {
		path := filepath.Join(opts.OutDir, opts.Name+".config.yaml")
		if err := os.WriteFile(path, []byte(opts.Config), 0o644); err != nil {
			return nil, fmt.Errorf("upstreamepp: write configuration: %w", err)
		}
		e.args = append(e.args, "--config-file="+path)
	}
	e.args = append(e.args, opts.Args...)
	if e.health, err = grpc.NewClient(e.HealthAddr(), grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
		return nil, fmt.Errorf("upstreamepp: health client: %w", err)
	}
	if err := e.start(ctx); err != nil {
		_ = e.health.Close()
		return nil, err
	}
	return e, nil
}

// freePorts finds n ports free on every interface, as the upstream EPP
// binds its servers (":port"); they stay free until it binds them unless
// another process takes one in between, which then fails its start.
func freePorts(n int) ([]int, error) {
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			_ = ln.Close()
		}
	}()
	ports := make([]int, 0, n)
	for range n {
		ln, err := net.Listen("tcp", ":0")
		if err != nil {
			return nil, fmt.Errorf("upstreamepp: free port: %w", err)
		}
		lns = append(lns, ln)
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func (e *EPP) start(ctx context.Context) error {
	e.mu.Lock()
	if e.cmd != nil {
		e.mu.Unlock()
		return errors.New("upstreamepp: already running")
	}
	log, err := os.OpenFile(e.LogPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		e.mu.Unlock()
		return fmt.Errorf("upstreamepp: log file: %w", err)
	}
	e.starts++
	fmt.Fprintf(log, "=== start %d at %s: %s %s\n", e.starts, time.Now().UTC().Format(time.RFC3339Nano), e.binary, strings.Join(e.args, " "))
	// Not CommandContext: the process outlives the context that starts
	// it, until Stop.
	cmd := exec.Command(e.binary, e.args...)
	cmd.Env = append(childEnv(), "KUBECONFIG="+e.cl.kubeconfig)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		e.mu.Unlock()
		return errors.Join(fmt.Errorf("upstreamepp: start %s: %w", e.binary, err), log.Close())
	}
	exited := make(chan struct{})
	e.cmd, e.log, e.exited, e.waitErr = cmd, log, exited, nil
	e.mu.Unlock()
	go func() {
		err := cmd.Wait()
		e.mu.Lock()
		e.waitErr = err
		e.mu.Unlock()
		close(exited)
	}()
	if err := e.waitReady(ctx, exited); err != nil {
		// The wait's error already tells how it ended; Stop cleans up.
		_ = e.Stop()
		return err
	}
	return nil
}

// childEnv is this process's environment without what would point the
// child at another cluster.
func childEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT":
			continue
		}
		env = append(env, kv)
	}
	return env
}

// waitReady waits for the health service to serve and the datastore to
// hold every pod, or for the process to exit, the start timeout or ctx.
func (e *EPP) waitReady(ctx context.Context, exited <-chan struct{}) error {
	ctx, cancel := context.WithTimeout(ctx, e.opts.StartTimeout)
	defer cancel()
	var last error
	for {
		last = e.readyNow(ctx)
		if last == nil {
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("upstreamepp: %s exited before it was ready (%v); its log %s ends:\n%s", e.opts.Name, e.exitErr(), e.LogPath(), e.logTail(4096))
		case <-ctx.Done():
			return fmt.Errorf("upstreamepp: %s not ready after %s: %w; its log %s ends:\n%s", e.opts.Name, e.opts.StartTimeout, last, e.LogPath(), e.logTail(4096))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (e *EPP) readyNow(ctx context.Context) error {
	hctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	res, err := healthpb.NewHealthClient(e.health).Check(hctx, &healthpb.HealthCheckRequest{Service: extprocv3.ExternalProcessor_ServiceDesc.ServiceName})
	if err != nil {
		return fmt.Errorf("health: %w", err)
	}
	if res.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		return fmt.Errorf("health: %s", res.GetStatus())
	}
	fams, err := e.metrics(ctx)
	if err != nil {
		return err
	}
	seen := map[string]bool{}
	if f := fams["inference_pool_per_pod_queue_size"]; f != nil {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "model_server_pod" {
					// An endpoint is named <pod>-rank-<i>, one per target port.
					pod, _, _ := strings.Cut(l.GetValue(), "-rank-")
					seen[pod] = true
				}
			}
		}
	}
	for _, p := range e.cl.opts.Pods {
		if !seen[p.Name] {
			return fmt.Errorf("pod %s not yet in its datastore (inference_pool_per_pod_queue_size)", p.Name)
		}
	}
	return nil
}

// WaitScraped waits until the EPP reports every pod of the pool with
// fresh metrics (inference_pool_ready_pods, which it refreshes every 5s
// by default), so that the first picks weigh real queues and KV usage.
func (e *EPP) WaitScraped(ctx context.Context) error {
	var last error
	for {
		fams, err := e.metrics(ctx)
		if err == nil {
			last = fmt.Errorf("inference_pool_ready_pods is not %d", len(e.cl.opts.Pods))
			if f := fams["inference_pool_ready_pods"]; f != nil {
				for _, m := range f.GetMetric() {
					if int(m.GetGauge().GetValue()) == len(e.cl.opts.Pods) {
						return nil
					}
					last = fmt.Errorf("inference_pool_ready_pods is %v, not %d", m.GetGauge().GetValue(), len(e.cl.opts.Pods))
				}
			}
		} else {
			last = err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("upstreamepp: %s: %w (%v)", e.opts.Name, ctx.Err(), last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (e *EPP) metricsText(ctx context.Context) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+e.MetricsAddr()+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	defer res.Body.Close()
	// Bounded: a misbehaving child must not grow this process.
	body, err := io.ReadAll(io.LimitReader(res.Body, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	if res.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("metrics: %s", res.Status)
	}
	return body, nil
}

// Metrics are the process's metrics as its /metrics serves them now.
func (e *EPP) Metrics(ctx context.Context) (map[string]*dto.MetricFamily, error) {
	return e.metrics(ctx)
}

func (e *EPP) metrics(ctx context.Context) (map[string]*dto.MetricFamily, error) {
	body, err := e.metricsText(ctx)
	if err != nil {
		return nil, err
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	return fams, nil
}

// Addr is the ext_proc server's address (plaintext gRPC).
func (e *EPP) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(e.ports.grpc)) }

// HealthAddr is the gRPC health server's address.
func (e *EPP) HealthAddr() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(e.ports.health))
}

// MetricsAddr is the metrics server's address.
func (e *EPP) MetricsAddr() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(e.ports.metrics))
}

// LogPath is the file the process's output goes to.
func (e *EPP) LogPath() string { return filepath.Join(e.opts.OutDir, e.opts.Name+".log") }

// MetricsPath is the file its /metrics is written to at each stop.
func (e *EPP) MetricsPath() string { return filepath.Join(e.opts.OutDir, e.opts.Name+".metrics") }

// Args are the flags it runs with.
func (e *EPP) Args() []string { return append([]string(nil), e.args...) }

func (e *EPP) exitErr() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.waitErr
}

func (e *EPP) logTail(n int64) string {
	f, err := os.Open(e.LogPath())
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Size() > n {
		_, _ = f.Seek(st.Size()-n, io.SeekStart)
	}
	b, _ := io.ReadAll(io.LimitReader(f, n))
	return string(b)
}

// Stop writes the EPP's metrics to MetricsPath and stops it: SIGTERM, as
// the kubelet stops a pod, then SIGKILL if it has not exited in 20s.
// An exit other than the one asked for is an error.
func (e *EPP) Stop() error {
	e.mu.Lock()
	cmd, exited, log := e.cmd, e.exited, e.log
	e.mu.Unlock()
	if cmd == nil {
		return nil
	}
	var errs []error
	select {
	case <-exited:
		errs = append(errs, fmt.Errorf("upstreamepp: %s had exited (%v); its log %s ends:\n%s", e.opts.Name, e.exitErr(), e.LogPath(), e.logTail(2048)))
	default:
		errs = append(errs, e.saveMetrics())
		if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
			errs = append(errs, fmt.Errorf("upstreamepp: SIGTERM: %w", err))
		}
		select {
		case <-exited:
			if err := e.exitErr(); err != nil && !terminated(err) {
				errs = append(errs, fmt.Errorf("upstreamepp: %s exited: %w", e.opts.Name, err))
			}
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
			errs = append(errs, fmt.Errorf("upstreamepp: %s did not exit within 20s of SIGTERM; killed", e.opts.Name))
		}
	}
	fmt.Fprintf(log, "=== stopped at %s\n", time.Now().UTC().Format(time.RFC3339Nano))
	errs = append(errs, log.Close())
	e.mu.Lock()
	e.cmd, e.log = nil, nil
	e.mu.Unlock()
	return errors.Join(errs...)
}

// terminated says whether a process ended by the SIGTERM it was sent
// rather than by exiting on it.
func terminated(err error) bool {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return false
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGTERM
}

func (e *EPP) saveMetrics() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	body, err := e.metricsText(ctx)
	if err != nil {
		return fmt.Errorf("upstreamepp: %s's metrics at stop: %w", e.opts.Name, err)
	}
	f, err := os.OpenFile(e.MetricsPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("upstreamepp: %w", err)
	}
	fmt.Fprintf(f, "# === %s, start %d, at %s\n", e.opts.Name, e.starts, time.Now().UTC().Format(time.RFC3339Nano))
	_, err = f.Write(body)
	return errors.Join(err, f.Close())
}

// Restart stops the EPP and starts it again on the same ports with the
// same flags, as a pod's container restarts: it starts from an empty
// routing history.
func (e *EPP) Restart(ctx context.Context) error {
	if err := e.Stop(); err != nil {
		return err
	}
	return e.start(ctx)
}

// Close stops the EPP and its health client.
func (e *EPP) Close() error {
	err := e.Stop()
	return errors.Join(err, e.health.Close())
}

// Report says what runs: the binary's module and version, its flags and
// its configuration.
func (e *EPP) Report() string {
	var b strings.Builder
	fmt.Fprintf(&b, "upstream EPP %s %s (cmd/epp), binary %s\n", Module, Version, e.binary)
	fmt.Fprintf(&b, "flags: %s\n", strings.Join(e.args, " "))
	fmt.Fprintf(&b, "configuration: %s\n", e.opts.ConfigName)
	if e.opts.Config == ConfigDefault {
		b.WriteString("  (no --config-file: the binary's built-in default, queue-scorer 2, kv-cache-utilization-scorer 2, prefix-cache-scorer 3 on its approximate prefix index, max-score-picker)\n")
	} else {
		for _, l := range strings.Split(strings.TrimRight(e.opts.Config, "\n"), "\n") {
			b.WriteString("  " + l + "\n")
		}
	}
	fmt.Fprintf(&b, "output: %s, metrics at each stop: %s\n", e.LogPath(), e.MetricsPath())
	return b.String()
}
