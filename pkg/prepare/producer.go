package prepare

import (
	"context"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/plugin"
	"github.com/kvroute/kvroute/pkg/request"
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

// InlineProducer is a DataProducer whose Produce computes only over memory
// the process holds: no I/O, no waiting on anything but briefly held locks.
// When ProducesInline reports true, Graph.Run calls it on the request's own
// goroutine instead of handing the request to a goroutine of its own and
// back; its deadline is then checked when it returns, as for any producer,
// but Run cannot return before it does. When every producer is inline,
// each is given the request's candidates themselves (in a slice of its
// own), its Puts held back until it returns in time: it must change them
// only through Put, and use them only on the goroutine it was called on.
type InlineProducer interface {
	ProducesInline() bool
}
