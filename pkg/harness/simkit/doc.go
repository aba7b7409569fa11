// Package simkit puts a simulated engine (pkg/sim) beside the EPP's
// components, in their terms: the relay that an engine publishing straight
// to NATS has beside it in a pod (its mirror's snapshots and heartbeats,
// the relay's own code), the engine's ground truth under the keys of the
// EPP's index, and the engine's tokenizer as the request path's. The
// engine knows nothing of any of them.
package simkit
