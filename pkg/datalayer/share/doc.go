// Package share shares the dispatches of a pool's EPP replicas over NATS,
// so that each replica's in-flight accounting (the load the scorers and the
// latency predictor see on every endpoint) counts what every replica sent,
// not only its own share.
//
// Each replica publishes, on events.DispatchSubject, batches of its own
// dispatches' steps (sent, first token, ended) and, every sync interval,
// the whole set it has in flight; it applies its peers' to its datastore
// as dispatches of their own, never announced again. A peer's dispatch
// that no message ends fades out at its expected end plus a margin.
// Memory is bounded by caps on the peers' entries per endpoint and in
// all, bandwidth by the batching and a cap on what waits to be sent.
package share
