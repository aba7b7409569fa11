package director

import (
	"net/http"
	"time"

	"github.com/kvroute/kvroute/pkg/datalayer"
)

// Outcome is how the response s to the pick p counts for its endpoint's
// outlier detection:
//   - connect: no whole answer came (Served.ConnFailed);
//   - 5xx: a server error;
//   - none: no answer seen (the client left, or the gateway told nothing),
//     or a 4xx, which is the request's fault;
//   - implausible: a success whose first byte (or, with none seen, its
//     end) came sooner after the request arrived than the prompt's
//     uncached tokens take at the pool's peak prefill rate
//     (OutlierDetection.PeakPrefillRate). The tokens taken as cached are
//     the most of what the index matched there and what the engine says
//     it found, so that neither a stale index nor an honest cache hit can
//     make a real answer look too fast;
//   - success otherwise.
//
// Answers whose usage cannot be are the self-check's to judge
// (selfcheck.Impossible).
func (d *Director) Outcome(p *Pick, s Served) datalayer.Outcome {
	switch {
	case s.ConnFailed:
		return datalayer.OutcomeConnect
	case s.Status >= http.StatusInternalServerError:
		return datalayer.Outcome5xx
	case s.Status == 0 || s.Status >= http.StatusBadRequest:
		return datalayer.OutcomeNone
	}
	if d.tooFast(p, s) {
		return datalayer.OutcomeImplausible
	}
	return datalayer.OutcomeSuccess
}

// tooFast is Outcome's implausibility test.
func (d *Director) tooFast(p *Pick, s Served) bool {
	if d.o.Outliers == nil {
		return false
	}
	od, ok := d.o.Outliers.OutlierDetection()
	if !ok || p.Request == nil || p.dispatchStart().IsZero() {
		return false
	}
	first := s.FirstByte
	if first.IsZero() {
		first = s.End
	}
	if first.IsZero() {
		return false
	}
	prompt := len(p.Request.TokenIDs)
	if prompt == 0 {
		prompt = s.Usage.PromptTokens
	}
	cached := s.Usage.CachedTokens
	if c := servedCandidate(p, servedBy(p, s)); c != nil {
		if info, ok := datalayer.PrefixCacheInfoOf(c); ok {
			cached = max(cached, info.MatchTokens)
		}
	}
	uncached := prompt - cached
	if uncached <= 0 {
		return false
	}
	least := time.Duration(float64(uncached) / od.PeakPrefillRate * float64(time.Second))
	return first.Sub(p.dispatchStart()) < least
}

// servedBy is the address that served s: the gateway's word, else the
// pick's primary.
func servedBy(p *Pick, s Served) string {
	if s.Endpoint != "" || len(p.Targets) == 0 {
		return s.Endpoint
	}
	return p.Targets[0]
}

// servedCandidate is the candidate at addr, nil when none.
func servedCandidate(p *Pick, addr string) *datalayer.Candidate {
	for _, c := range p.Candidates {
		if c.Address == addr {
			return c
		}
	}
	return nil
}
