// Package scrape reads each endpoint's Prometheus /metrics (queue depth,
// running requests, KV-cache usage, loaded LoRA adapters, cache geometry) into
// the datastore, one polling loop per endpoint.
package scrape
