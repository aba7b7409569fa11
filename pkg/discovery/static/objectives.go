package static

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/yaml"

	"github.com/kvroute/kvroute/pkg/datalayer"
)

// ErrObjectives marks a static objectives file that cannot be used.
var ErrObjectives = errors.New("invalid static objectives file")

// objectivesFile is the YAML shape of a static objectives file, the
// standalone mode's InferenceObjectives:
//
//	objectives:
//	- name: chat
//	  priority: 10
//	  ttftSLOMs: 300     # default SLOs of the requests naming it
//	  tpotSLOMs: 50
//	- name: batch
//	  priority: -1       # below zero: sheddable
type objectivesFile struct {
	Objectives []staticObjective `json:"objectives"`
}

type staticObjective struct {
	Name      string   `json:"name"`
	Priority  int      `json:"priority,omitempty"`
	TTFTSLOMs *float64 `json:"ttftSLOMs,omitempty"`
	TPOTSLOMs *float64 `json:"tpotSLOMs,omitempty"`
}

// ParseObjectives reads a static objectives file. Every problem is
// reported, each naming its entry; the error wraps ErrObjectives.
func ParseObjectives(data []byte) ([]datalayer.Objective, error) {
	var f objectivesFile
	if err := yaml.UnmarshalStrict(data, &f); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrObjectives, err)
	}
	var errs []error
	seen := make(map[string]int, len(f.Objectives))
	out := make([]datalayer.Objective, 0, len(f.Objectives))
	for i, so := range f.Objectives {
		where := fmt.Sprintf("objectives[%d]", i)
		if so.Name != "" {
			where += fmt.Sprintf(" %q", so.Name)
		}
		bad := func(format string, args ...any) {
			errs = append(errs, fmt.Errorf("%w: %s: %s", ErrObjectives, where, fmt.Sprintf(format, args...)))
		}
		if so.Name == "" {
			bad("missing name")
		} else if j, dup := seen[so.Name]; dup {
			bad("duplicate name, also objectives[%d]", j)
		} else {
			seen[so.Name] = i
		}
		o := datalayer.Objective{Name: so.Name, Priority: so.Priority}
		for _, slo := range []struct {
			field string
			ms    *float64
			into  *time.Duration
		}{{"ttftSLOMs", so.TTFTSLOMs, &o.TTFT}, {"tpotSLOMs", so.TPOTSLOMs, &o.TPOT}} {
			if slo.ms == nil {
				continue
			}
			if !(*slo.ms > 0) || *slo.ms > 1e9 || math.IsInf(*slo.ms, 0) {
				bad("%s = %v, want a positive number of milliseconds", slo.field, *slo.ms)
				continue
			}
			*slo.into = time.Duration(*slo.ms * float64(time.Millisecond))
		}
		out = append(out, o)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return out, nil
}

// Objectives keeps an objectives store in step with a static objectives
// file.
type Objectives struct {
	path    string
	store   *datalayer.Objectives
	logger  *slog.Logger
	reloads *prometheus.CounterVec
	sum     uint64
	loaded  bool
}

// LoadObjectives reads the static objectives file at path into store; an
// error leaves store untouched. Run then follows later versions.
func LoadObjectives(path string, store *datalayer.Objectives, reg prometheus.Registerer, logger *slog.Logger) (*Objectives, error) {
	if logger == nil {
		logger = slog.Default()
	}
	o := &Objectives{path: path, store: store, logger: logger, reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvroute_static_objectives_reloads_total",
		Help: "Loads of the static objectives file, by result (ok, error).",
	}, []string{"result"})}
	if reg != nil {
		if err := reg.Register(o.reloads); err != nil {
			return nil, fmt.Errorf("static objectives: %w", err)
		}
	}
	if err := o.load(); err != nil {
		return nil, err
	}
	return o, nil
}

// Run re-reads the file every second, as File.Run does; a bad new version
// keeps the last good objectives and is logged once.
func (o *Objectives) Run(ctx context.Context) { o.run(ctx, time.Second) }

func (o *Objectives) run(ctx context.Context, every time.Duration) {
	poll(ctx, every, o.load, func(err error) {
		o.logger.Error("static objectives file rejected, keeping the last good objectives", "path", o.path, "error", err)
	})
}

func (o *Objectives) load() error {
	data, err := readLimited(o.path)
	sum := xxhash.Sum64(data)
	if err != nil {
		sum = xxhash.Sum64String("read error: " + err.Error())
	}
	if o.loaded && sum == o.sum {
		return errUnchanged
	}
	o.sum, o.loaded = sum, true
	var objs []datalayer.Objective
	if err == nil {
		objs, err = ParseObjectives(data)
	}
	if err != nil {
		o.reloads.WithLabelValues("error").Inc()
		return fmt.Errorf("load static objectives from %s: %w", o.path, err)
	}
	o.reloads.WithLabelValues("ok").Inc()
	o.store.Replace(objs)
	o.logger.Info("static objectives loaded", "path", o.path, "objectives", len(objs))
	return nil
}

// poll calls load every interval until ctx is done, reporting each new
// failure (not errUnchanged) to onErr.
func poll(ctx context.Context, every time.Duration, load func() error, onErr func(error)) {
	// Polling content rather than watching inotify events: a ConfigMap
	// volume swaps a symlink, editors rename over the file, and network
	// file systems send no events at all; re-reading a small file once a
	// second handles every case alike.
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := load(); err != nil && !errors.Is(err, errUnchanged) {
				onErr(err)
			}
		}
	}
}
