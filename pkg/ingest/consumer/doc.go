// Package consumer is the EPP's intake of KV events from NATS (core
// subscriptions or a JetStream ordered consumer): it reads each batch's origin
// from the contract's headers, orders each stream's batches by sequence
// number, tells its Sink of gaps, engine restarts, reconnects and slow-
// consumer drops, and delivers batches to the Sink one stream at a time.
package consumer
