// Package index is the exact prefix index: which endpoint holds which block of
// which prompt prefix, and in which cache tier, kept from each endpoint's KV
// events in order. Its keys are kvroute's own chained hashes over token ids
// (RootKey, AppendBlockKeys), computed alike from events and from requests, so
// that a lookup walks a request's blocks from the first and stops where no
// candidate holds the next.
package index
