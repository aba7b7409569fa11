// Package predict is kvroute's latency predictor: for one request on one
// endpoint, the time to first token and the time per output token it will
// see, as a mean and as a quantile (p90 by default), predicted from what
// the EPP knows exactly at pick time (the prompt tokens cached in each
// tier, the endpoint's queue as scraped, and the work this EPP has itself
// dispatched there) and learned online from the responses it routes. It is
// pure Go with no service: a prediction is a few dot products against a
// model snapshot, allocation-free; learning runs on its own goroutine; a
// model starts from a prior and forgets old observations, so it follows a
// fleet that changes. docs/predictor.md says which learning method it uses
// and why.
package predict
