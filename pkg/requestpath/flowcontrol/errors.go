package flowcontrol

import (
	"errors"
	"net/http"
)

// Outcomes of a request's wait, as errors callers test with errors.Is.
var (
	// ErrQueueAtCapacity: the request's band, or the controller, holds as
	// many requests or bytes as it may, and nothing of lower priority
	// could be displaced to make room.
	ErrQueueAtCapacity = errors.New("queue at capacity")
	// ErrDisplaced: a request of higher priority took the waiting
	// request's place when the queues were full.
	ErrDisplaced = errors.New("displaced by a request of higher priority")
	// ErrTTLExpired: the request waited its whole TTL.
	ErrTTLExpired = errors.New("request TTL expired in queue")
	// ErrSLOUnreachable: the time it waited plus the best TTFT any
	// endpoint is predicted to give it exceeds its TTFT SLO.
	ErrSLOUnreachable = errors.New("TTFT SLO can no longer be met")
	// ErrCancelled: the client went away while its request waited.
	ErrCancelled = errors.New("client went away while queued")
	// ErrStopped: the controller stopped while the request waited.
	ErrStopped = errors.New("controller stopped")
)

// Outcome labels, as the metrics and the reason header name them.
const (
	OutcomeDispatched       = "Dispatched"
	OutcomeRejectedCapacity = "RejectedCapacity"
	OutcomeRejectedSLO      = "RejectedSLO"
	OutcomeEvictedTTL       = "EvictedTTL"
	OutcomeEvictedDisplaced = "EvictedDisplaced"
	OutcomeEvictedCancelled = "EvictedContextCancelled"
	OutcomeEvictedOther     = "EvictedOther"
)

// OutcomeOf names err's outcome; OutcomeDispatched for nil.
func OutcomeOf(err error) string {
	switch {
	case err == nil:
		return OutcomeDispatched
	case errors.Is(err, ErrQueueAtCapacity):
		return OutcomeRejectedCapacity
	case errors.Is(err, ErrSLOUnreachable):
		return OutcomeRejectedSLO
	case errors.Is(err, ErrTTLExpired):
		return OutcomeEvictedTTL
	case errors.Is(err, ErrDisplaced):
		return OutcomeEvictedDisplaced
	case errors.Is(err, ErrCancelled):
		return OutcomeEvictedCancelled
	default:
		return OutcomeEvictedOther
	}
}

// StatusOf is the HTTP status a client gets for err, as upstream maps its
// outcomes: capacity (and displacement, capacity taken back) 429; a TTL
// run out, a client gone and an SLO out of reach 503.
func StatusOf(err error) int {
	switch {
	case errors.Is(err, ErrQueueAtCapacity), errors.Is(err, ErrDisplaced):
		return http.StatusTooManyRequests
	case errors.Is(err, ErrTTLExpired), errors.Is(err, ErrSLOUnreachable), errors.Is(err, ErrCancelled), errors.Is(err, ErrStopped):
		return http.StatusServiceUnavailable
	default:
		return http.StatusInternalServerError
	}
}
