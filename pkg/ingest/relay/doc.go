// Package relay is the sidecar that carries one vLLM engine's KV-cache
// events from its ZeroMQ publisher onto NATS: the payload unchanged, the
// NATS contract's headers added. It fills sequence gaps from the engine's
// replay socket, holds batches in a bounded buffer while NATS is away, and
// keeps a mirror of the engine's cache, rebuilt from the batches it relays,
// from which it answers snapshot requests (docs/snapshot.md) so that an
// EPP that lost part of the stream can resynchronise without waiting for
// the engine to repeat itself.
package relay
