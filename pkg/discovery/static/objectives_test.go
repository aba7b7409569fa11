package static

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/testkit"
)

const twoObjectives = `
objectives:
- name: chat
  priority: 10
  ttftSLOMs: 300
  tpotSLOMs: 50.5
- name: batch
  priority: -1
`

func TestParseObjectives(t *testing.T) {
	t.Parallel()
	objs, err := ParseObjectives([]byte(twoObjectives))
	if err != nil {
		t.Fatal(err)
	}
	want := []datalayer.Objective{
		{Name: "chat", Priority: 10, TTFT: 300 * time.Millisecond, TPOT: 50500 * time.Microsecond},
		{Name: "batch", Priority: -1},
	}
	if len(objs) != 2 || objs[0] != want[0] || objs[1] != want[1] {
		t.Errorf("ParseObjectives = %+v, want %+v", objs, want)
	}
}

func TestParseObjectivesRejectsWithEveryReason(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		data  string
		wants []string
	}{
		{"a misspelt field is an error, not a silent default", "objectives:\n- {name: a, prority: 3}\n", []string{`unknown field "prority"`}},
		{"every bad entry is named", "objectives:\n- {priority: 1}\n- {name: b, ttftSLOMs: -5}\n- {name: b, tpotSLOMs: 0}\n",
			[]string{"objectives[0]: missing name", `objectives[1] "b": ttftSLOMs = -5`, `objectives[2] "b": duplicate name, also objectives[1]`, `objectives[2] "b": tpotSLOMs = 0`}},
		{"a priority that is not an integer", "objectives:\n- {name: a, priority: high}\n", []string{"priority"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := ParseObjectives([]byte(tt.data))
			if !errors.Is(err, ErrObjectives) {
				t.Fatalf("err = %v, want ErrObjectives", err)
			}
			for _, w := range tt.wants {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

func FuzzParseObjectives(f *testing.F) {
	f.Add([]byte(twoObjectives))
	f.Add([]byte("objectives: []\n"))
	f.Add([]byte("objectives:\n- {name: a, ttftSLOMs: 1e400}\n"))
	f.Add([]byte("{\"objectives\": [{\"name\": 1}]}"))
	f.Add([]byte("objectives: &a [*a]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		objs, err := ParseObjectives(data)
		if err != nil {
			if !errors.Is(err, ErrObjectives) {
				t.Fatalf("error %v does not wrap ErrObjectives", err)
			}
			return
		}
		seen := map[string]bool{}
		for _, o := range objs {
			if o.Name == "" || seen[o.Name] || o.TTFT < 0 || o.TPOT < 0 {
				t.Fatalf("accepted %+v", o)
			}
			seen[o.Name] = true
		}
	})
}

func TestTheObjectivesFileIsFollowed(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "objectives.yaml")
	writeFile(t, path, twoObjectives)
	store := datalayer.NewObjectives(nil)
	reg := prometheus.NewRegistry()
	o, err := LoadObjectives(path, store, reg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := store.Get("batch"); got.Priority != -1 {
		t.Fatalf("after the first load batch = %+v", got)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { o.run(ctx, 10*time.Millisecond); close(done) }()
	writeFile(t, path, "objectives:\n- {name: batch, priority: -5}\n")
	testkit.WaitFor(t, "the reload", func() error {
		got, ok := store.Get("batch")
		_, chat := store.Get("chat")
		if !(ok) {
			return errors.New("ok is false")
		}
		if got.Priority != -5 {
			return fmt.Errorf("got.Priority is %v, want %v", got.Priority, -5)
		}
		if chat {
			return errors.New("chat is still true")
		}
		return nil
	})
	writeFile(t, path, "objectives:\n- {name: batch, priority: x}\n")
	testkit.WaitFor(t, "the bad version to be refused", func() error {
		if seen := testkit.Value(t, reg, "kvroute_static_objectives_reloads_total", "result", "error"); seen != 1 {
			return fmt.Errorf("testkit.Value(t, reg, \"kvroute_static_objectives_reloads_total\", \"result\", \"error\") is %v, want %v", seen, 1)
		}
		return nil
	})
	if got, _ := store.Get("batch"); got.Priority != -5 {
		t.Errorf("a bad file changed the objectives: %+v", got)
	}
	cancel()
	<-done
	if _, err := LoadObjectives(filepath.Join(t.TempDir(), "missing.yaml"), store, nil, nil); err == nil {
		t.Error("a missing first file was accepted")
	}
}
