package static

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/yaml"

	"github.com/kvroute/kvroute/pkg/datalayer"
)

// ErrStaticConfig marks a static endpoints file that cannot be used.
var ErrConfig = errors.New("invalid static endpoints file")

// maxStaticFileSize bounds what the watcher reads, so a file replaced by
// something huge cannot exhaust memory.
const maxStaticFileSize = 8 << 20

// staticFile is the YAML shape of a static endpoints file:
//
//	endpoints:
//	- name: vllm-0
//	  address: 10.0.0.7:8000
//	  model: meta-llama/Llama-3.1-8B-Instruct
//	  labels: {app: vllm}
//	  topology: {hostname: node-7, rack: r12, zone: us-east-1a, region: us-east-1}
type staticFile struct {
	Endpoints []staticEndpoint `json:"endpoints"`
}

type staticEndpoint struct {
	Name      string            `json:"name"`
	Address   string            `json:"address"`
	Model     string            `json:"model"`
	Pod       string            `json:"pod,omitempty"`
	Namespace string            `json:"namespace,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
	// Topology is where the endpoint runs, as its node's labels would say
	// in Kubernetes (kubernetes.io/hostname, a rack label,
	// topology.kubernetes.io/zone and region); any field may be left out.
	Topology datalayer.Topology `json:"topology,omitempty"`
}

// maxTopologyValue bounds a topology field: a node name is a DNS
// subdomain, at most 253 characters.
const maxTopologyValue = 253

// ParseStaticEndpoints reads a static endpoints file. Every problem is
// reported (not only the first), each naming its entry by position and name;
// the error wraps ErrStaticConfig.
func Parse(data []byte) ([]*datalayer.Endpoint, error) {
	var f staticFile
	// Strict, so a misspelt field ("adress") is an error rather than an
	// endpoint silently missing its address.
	if err := yaml.UnmarshalStrict(data, &f); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	var errs []error
	names := make(map[string]int, len(f.Endpoints))
	addrs := make(map[string]int, len(f.Endpoints))
	out := make([]*datalayer.Endpoint, 0, len(f.Endpoints))
	for i, se := range f.Endpoints {
		where := fmt.Sprintf("endpoints[%d]", i)
		if se.Name != "" {
			where += fmt.Sprintf(" %q", se.Name)
		}
		bad := func(format string, args ...any) {
			errs = append(errs, fmt.Errorf("%w: %s: %s", ErrConfig, where, fmt.Sprintf(format, args...)))
		}
		if se.Name == "" {
			bad("missing name")
		} else if j, dup := names[se.Name]; dup {
			bad("duplicate name, also endpoints[%d]", j)
		} else {
			names[se.Name] = i
		}
		addr, err := parseEndpointAddress(se.Address)
		if err != nil {
			bad("%v", err)
		} else if j, dup := addrs[addr]; dup {
			bad("duplicate address %s, also endpoints[%d]", addr, j)
		} else {
			addrs[addr] = i
		}
		if se.Model == "" {
			bad("missing model")
		}
		for _, f := range [...]struct{ name, v string }{
			{"hostname", se.Topology.Host}, {"rack", se.Topology.Rack}, {"zone", se.Topology.Zone}, {"region", se.Topology.Region},
		} {
			if len(f.v) > maxTopologyValue {
				bad("topology.%s is %d bytes, at most %d", f.name, len(f.v), maxTopologyValue)
			}
		}
		pod := se.Pod
		if pod == "" {
			pod = se.Name
		}
		out = append(out, &datalayer.Endpoint{
			Name:      se.Name,
			Address:   addr,
			Pod:       pod,
			Namespace: se.Namespace,
			Model:     se.Model,
			Labels:    se.Labels,
			Topology:  se.Topology,
		})
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return out, nil
}

// parseEndpointAddress accepts an ip:port and returns it in canonical form,
// so the same endpoint written two ways is caught as a duplicate and matches
// the Kv-Endpoint header its events carry. A host name is refused: the
// gateway routes to addresses, not names.
func parseEndpointAddress(s string) (string, error) {
	if s == "" {
		return "", errors.New("missing address")
	}
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return "", fmt.Errorf("address %q: want ip:port: %w", s, err)
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return "", fmt.Errorf("address %q: host must be an IP address", s)
	}
	if ip.Zone() != "" {
		return "", fmt.Errorf("address %q: zoned IPv6 addresses are not routable by the gateway", s)
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil || p == 0 {
		return "", fmt.Errorf("address %q: port must be 1 to 65535", s)
	}
	return netip.AddrPortFrom(ip.Unmap(), uint16(p)).String(), nil
}

// File keeps a datastore in step with a static endpoints file.
type File struct {
	w staticWatcher
}

// Load reads the static endpoints file at path into ds; an error leaves ds
// untouched. Run then keeps ds in step with later versions. Its metrics are
// registered with reg unless reg is nil.
func Load(path string, ds *datalayer.Datastore, reg prometheus.Registerer, logger *slog.Logger) (*File, error) {
	if logger == nil {
		logger = slog.Default()
	}
	reloads := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvroute_static_discovery_reloads_total",
		Help: "Loads of the static endpoints file, by result (ok, error).",
	}, []string{"result"})
	if reg != nil {
		if err := reg.Register(reloads); err != nil {
			return nil, fmt.Errorf("static endpoints: %w", err)
		}
	}
	f := &File{w: staticWatcher{path: path, ds: ds, logger: logger, reloads: reloads}}
	if err := f.w.load(); err != nil {
		return nil, err
	}
	return f, nil
}

// Run re-reads the file every second and applies it when its content
// changes. A bad new version keeps the last good set of endpoints and is
// logged and counted once. It returns when ctx is done.
func (f *File) Run(ctx context.Context) {
	f.run(ctx, time.Second)
}

func (f *File) run(ctx context.Context, every time.Duration) {
	poll(ctx, every, f.w.load, func(err error) {
		f.w.logger.Error("static endpoints file rejected, keeping the last good endpoints", "path", f.w.path, "error", err)
	})
}

var errUnchanged = errors.New("static file: already reported")

type staticWatcher struct {
	path    string
	ds      *datalayer.Datastore
	logger  *slog.Logger
	reloads *prometheus.CounterVec
	// checks counts reads of the file, so that a test can wait for the
	// next ones instead of sleeping.
	checks atomic.Int64
	// sum is the hash of the last content acted upon, good or bad, so an
	// unchanged file is neither re-applied nor re-reported.
	sum    uint64
	loaded bool
	// names are the endpoints this file put in the datastore, so that a
	// reload removes only its own.
	names map[string]struct{}
}

func (w *staticWatcher) load() error {
	defer w.checks.Add(1)
	data, err := readLimited(w.path)
	sum := xxhash.Sum64(data)
	if err != nil {
		sum = xxhash.Sum64String("read error: " + err.Error())
	}
	if w.loaded && sum == w.sum {
		return errUnchanged
	}
	w.sum, w.loaded = sum, true
	var eps []*datalayer.Endpoint
	if err == nil {
		eps, err = Parse(data)
	}
	if err != nil {
		w.reloads.WithLabelValues("error").Inc()
		return fmt.Errorf("load static endpoints from %s: %w", w.path, err)
	}
	w.reloads.WithLabelValues("ok").Inc()
	next := make(map[string]struct{}, len(eps))
	for _, ep := range eps {
		next[ep.Name] = struct{}{}
	}
	for name := range w.names {
		if _, keep := next[name]; !keep {
			w.ds.Remove(name)
		}
	}
	for _, ep := range eps {
		w.ds.Upsert(ep)
	}
	w.names = next
	w.logger.Info("static endpoints loaded", "path", w.path, "endpoints", len(eps))
	return nil
}

func readLimited(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var buf bytes.Buffer
	n, err := buf.ReadFrom(io.LimitReader(f, maxStaticFileSize+1))
	if err != nil {
		return nil, err
	}
	if n > maxStaticFileSize {
		return nil, fmt.Errorf("%w: larger than %d bytes", ErrConfig, maxStaticFileSize)
	}
	return buf.Bytes(), nil
}
