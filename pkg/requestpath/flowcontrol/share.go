package flowcontrol

import (
	"math"
	"time"
)

// Each flow's usage is the work released for it lately, and its demand
// the work it sent: its requests' costs (prompt tokens), decaying with a
// time constant of shareDecay, so that a flow idle for a while starts
// afresh, and neither banks credit while idle nor pays for a burst long
// past. Under FairShare the flow with the least usage goes first. A flow
// floods when its demand is more than half again the average of the flows
// active lately (requests arriving within shareWindow): under FairShare
// its requests then go behind every flow within its share, and they are
// released only where they leave room for the others' (Protect), so that
// what it sends beyond its share is served from what the others leave,
// not at their expense.
const (
	shareDecay  = 5 * time.Second
	shareWindow = 10 * time.Second
	// maxShares bounds the flows remembered: beyond it, those with
	// nothing left of their usage and no recent arrival are forgotten.
	maxShares = 1024
)

// floodFactor is how far above the average demand a flow floods.
const floodFactor = 1.5

type share struct {
	used, sent decayed
	arrived    time.Time
}

// decayed is an amount decaying with a time constant of shareDecay.
type decayed struct {
	v  float64 // as of at
	at time.Time
}

func (d decayed) now(now time.Time) float64 {
	if d.v == 0 {
		return 0
	}
	return d.v * math.Exp(-float64(now.Sub(d.at))/float64(shareDecay))
}

func (d *decayed) add(x float64, now time.Time) {
	d.v, d.at = d.now(now)+x, now
}

// usage is s's usage now (nil: none).
func (s *share) usage(now time.Time) float64 {
	if s == nil {
		return 0
	}
	return s.used.now(now)
}

// shareLocked returns flow's share, made if it fits the bound.
func (c *Controller) shareLocked(flow string, now time.Time) *share {
	s := c.shares[flow]
	if s != nil {
		return s
	}
	if len(c.shares) >= maxShares {
		for id, o := range c.shares {
			if o.usage(now) < 1 && o.sent.now(now) < 1 && now.Sub(o.arrived) > shareWindow {
				delete(c.shares, id)
			}
		}
		if len(c.shares) >= maxShares {
			return nil
		}
	}
	s = &share{}
	c.shares[flow] = s
	return s
}

// arrivedLocked notes a request of flow, of work cost, arriving.
func (c *Controller) arrivedLocked(flow string, cost float64, now time.Time) {
	s := c.shareLocked(flow, now)
	if s == nil {
		return
	}
	if s.arrived.IsZero() || now.Sub(s.arrived) > shareWindow {
		c.active++
	}
	s.arrived = now
	s.sent.add(max(cost, 1), now)
	c.demand.add(max(cost, 1), now)
}

// releasedLocked adds a released request's cost (zero counts as one) to
// its flow's usage.
func (c *Controller) releasedLocked(flow string, cost float64, now time.Time) {
	if s := c.shareLocked(flow, now); s != nil {
		s.used.add(max(cost, 1), now)
	}
}

// usageLocked is flow's decayed usage now.
func (c *Controller) usageLocked(flow string, now time.Time) float64 {
	return c.shares[flow].usage(now)
}

// floodLimitLocked is the demand above which a flow floods now:
// floodFactor times the demand of every flow over the flows active lately
// (what is left of the idle ones' demand is small beside it); infinite
// while fewer than two are active. Every arrival and check asks it, so it
// costs no walk of the flows: an arrival counts its flow in when it was
// idle, and the flows gone idle are counted out every activeEvery.
func (c *Controller) floodLimitLocked(now time.Time) float64 {
	if now.Sub(c.activeAt) >= activeEvery {
		c.active, c.activeAt = 0, now
		for _, s := range c.shares {
			if now.Sub(s.arrived) <= shareWindow {
				c.active++
			}
		}
	}
	if c.active < 2 {
		return math.Inf(1)
	}
	return floodFactor * c.demand.now(now) / float64(c.active)
}

// activeEvery is how often the flows active lately are counted anew.
const activeEvery = 100 * time.Millisecond

// floodsBeyond says whether flow's demand is above limit.
func (c *Controller) floodsBeyond(flow string, limit float64, now time.Time) bool {
	s := c.shares[flow]
	return s != nil && s.sent.now(now) > limit
}
