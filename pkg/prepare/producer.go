package prepare

import (
	"context"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/framework/plugin"
	"github.com/kvroute/kvroute/pkg/framework/request"
)

// DataProducer is a PrepareData plugin: before scheduling, it computes data
// for each candidate and publishes it with Candidate.Put under the keys its
// Produces declares. It must return when ctx is done, and publish nothing
// after that.
type DataProducer interface {
	plugin.Producer
	plugin.Consumer
	Produce(ctx context.Context, req *request.Request, cands []*datalayer.Candidate) error
}
