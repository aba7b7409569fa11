// Package approx is the routing history, upstream's approximate prefix
// index: hashes of a request's blocks (or of its text in fixed-size chunks),
// and per endpoint an LRU of the hashes of requests sent there. It stands in
// for the cache of endpoints whose event stream is missing or uncertain,
// its answers marked not exact; and it says where prefixes were sent, apart
// from what is held, for the routing-history-producer.
package approx
