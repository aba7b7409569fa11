package director

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"

	"github.com/google/uuid"

	"github.com/kvroute/kvroute/pkg/request"
)

// PickAny routes a request that has no body (a GET of /v1/models, say) the
// way the upstream EPP does: to a random ready endpoint within the subset
// hint. Without a prompt there is nothing for PrepareData or the scheduler
// to weigh, so neither runs and the Pick's Result is nil.
func (d *Director) PickAny(_ context.Context, in *Input) (*Pick, error) {
	start := d.o.Now()
	req := &request.Request{API: request.APIOther, Headers: in.Headers, ID: in.Headers[HeaderRequestID]}
	if req.ID == "" {
		req.ID = uuid.NewString()
	}
	cands := d.o.Datastore.CandidatesInto(nil, subsetFilter(in.Subset))
	if len(cands) == 0 {
		d.o.Metrics.errors.WithLabelValues("", "", "503").Inc()
		return nil, &Error{Status: http.StatusServiceUnavailable, Err: fmt.Errorf("no ready endpoint%s", subsetNote(in.Subset))}
	}
	c := cands[rand.IntN(len(cands))]
	return &Pick{Request: req, Targets: []string{c.Address}, Candidates: cands, Start: start}, nil
}
