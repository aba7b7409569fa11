// Package approx is the approximate prefix index, upstream's guess from
// routing history: hashes of a request's text in fixed-size chunks, and per
// endpoint an LRU of the hashes of requests sent there. It answers only for
// endpoints whose event stream is missing or uncertain, and its answers are
// marked not exact.
package approx
