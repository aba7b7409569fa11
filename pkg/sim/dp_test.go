package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/sim/blockpool"
)

// dpServer is a data-parallel server of n ranks whose cores do not run:
// what is submitted stays waiting, so that each rank's load is what the
// test gave it.
func dpServer(t testing.TB, n int) *Server {
	t.Helper()
	var cores []*Core
	for rank := range n {
		eng := NewEngine(EngineConfig{Pod: "p", Address: "a", Model: "m",
			Pool: blockpool.Config{BlockSize: 4, GPUBlocks: 64, DPRank: rank, Seed: uint64(rank + 1)}}, nil)
		cores = append(cores, NewCore(eng, Timing{PrefillPerToken: time.Microsecond, DecodeStep: time.Millisecond, MaxSeqs: 4}))
	}
	return NewDPServer(cores, nil)
}

func TestADataParallelServerHonoursTheRankHeaderAndBalancesTheRest(t *testing.T) {
	t.Parallel()
	s := dpServer(t, 4)
	// Ranks 0, 1 and 3 are busier than rank 2 by vLLM's measure.
	for _, rank := range []int{0, 0, 1, 3} {
		if _, err := s.Ranks()[rank].Submit(blockpool.Request{Tokens: []uint32{1, 2, 3, 4}}, 1); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name, header string
		want         int // -1: refused
		pinned       bool
	}{
		{"a rank named is served there", "1", 1, true},
		{"a rank named with spaces too", " 3 ", 3, true},
		{"no rank: the least of waiting*4 + running", "", 2, false},
		{"a value that is not an integer is ignored", "two", 2, false},
		{"a rank past the last is refused", "4", -1, false},
		{"a negative rank is refused", "-1", -1, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodPost, "/v1/completions", nil)
			if tc.header != "" {
				r.Header.Set(HeaderDataParallelRank, tc.header)
			}
			_, pinnedBefore := s.RankServed()
			c, err := s.rankFor(r)
			if tc.want < 0 {
				if err == nil {
					t.Fatalf("served on a core, want refused")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c != s.Ranks()[tc.want] {
				t.Fatalf("served on another rank than %d", tc.want)
			}
			if _, pinned := s.RankServed(); (pinned[tc.want] > pinnedBefore[tc.want]) != tc.pinned {
				t.Fatalf("pinned counts %v, were %v", pinned, pinnedBefore)
			}
		})
	}
}

func TestADataParallelServerAnswersAnOutOfRangeRankWith400(t *testing.T) {
	t.Parallel()
	s := dpServer(t, 2)
	body, _ := json.Marshal(map[string]any{"model": "m", "prompt": []int{1, 2, 3}, "max_tokens": 1})
	r := httptest.NewRequest(http.MethodPost, "/v1/completions", bytes.NewReader(body)).WithContext(context.Background())
	r.Header.Set(HeaderDataParallelRank, "2")
	w := httptest.NewRecorder()
	s.Handler().ServeHTTP(w, r)
	if w.Code != http.StatusBadRequest || !bytes.Contains(w.Body.Bytes(), []byte("out of range [0, 2)")) {
		t.Fatalf("status %d: %s", w.Code, w.Body)
	}
}

func FuzzRankHeader(f *testing.F) {
	for _, s := range []string{"0", "3", "-1", "99999999999999999999", "x", " 1", "+2", "0x1", ""} {
		f.Add(s)
	}
	s := dpServer(f, 4)
	f.Fuzz(func(t *testing.T, v string) {
		r := httptest.NewRequest(http.MethodPost, "/v1/completions", nil)
		r.Header.Set(HeaderDataParallelRank, v)
		c, err := s.rankFor(r)
		if err == nil && c == nil {
			t.Fatalf("%q: no core and no error", v)
		}
	})
}
