package sim

import (
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
)

// A data-parallel engine is vLLM run with --data-parallel-size N behind
// one API server: N ranks, each an engine core with its own block pool,
// scheduler and KV event stream (the rank in each batch and in Kv-DP-Rank),
// at one address. The API server serves a request on the rank its
// X-data-parallel-rank header names; a request that names none goes to the
// rank vLLM's own balancing picks, the least of waiting*4 + running.

// HeaderDataParallelRank is the request header vLLM's API server reads to
// pin a request to a rank (HTTP header names are case-insensitive).
const HeaderDataParallelRank = "X-data-parallel-rank"

// NewDPServer serves the ranks' API on ln as one vLLM API server of a
// data-parallel engine; ranks[i] is rank i, at most MaxDPRanks of them.
// With a nil ln only its Handler serves.
func NewDPServer(ranks []*Core, ln net.Listener) *Server { return newServer(ranks, ln) }

// Ranks are the server's engine cores, rank order: one for an engine
// without data parallelism.
func (s *Server) Ranks() []*Core {
	if len(s.ranks) == 0 {
		return []*Core{s.r}
	}
	return s.ranks
}

// RankServed counts, per rank, the requests the server sent there and the
// requests among them whose rank header named it.
func (s *Server) RankServed() (served, pinned []int) {
	n := len(s.Ranks())
	served, pinned = make([]int, n), make([]int, n)
	for i := range n {
		served[i] = int(s.rankServed[i].Load())
		pinned[i] = int(s.rankPinned[i].Load())
	}
	return served, pinned
}

// rankFor is the core a generation request runs on: the rank its header
// names, as vLLM reads it (a value that is not an integer is ignored; one
// outside [0, N) is refused), else the least loaded by vLLM's measure.
func (s *Server) rankFor(r *http.Request) (*Core, error) {
	ranks := s.Ranks()
	if v := strings.TrimSpace(r.Header.Get(HeaderDataParallelRank)); v != "" {
		if n, err := strconv.Atoi(v); err == nil {
			if n < 0 || n >= len(ranks) {
				return nil, fmt.Errorf("data_parallel_rank %d is out of range [0, %d)", n, len(ranks))
			}
			s.countRank(n, true)
			return ranks[n], nil
		}
	}
	if len(ranks) == 1 {
		s.countRank(0, false)
		return ranks[0], nil
	}
	best, bestScore := 0, 0
	for i, c := range ranks {
		waiting, running := c.Load()
		if score := 4*waiting + running; i == 0 || score < bestScore {
			best, bestScore = i, score
		}
	}
	s.countRank(best, false)
	return ranks[best], nil
}

func (s *Server) countRank(n int, pinned bool) {
	if n >= len(s.rankServed) {
		return
	}
	s.rankServed[n].Add(1)
	if pinned {
		s.rankPinned[n].Add(1)
	}
}
