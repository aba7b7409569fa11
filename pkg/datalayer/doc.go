// Package datalayer is what the scheduler knows about endpoints: the
// datastore of candidate endpoints with their scraped metrics and event-stream
// state, the exact prefix index fed by KV events, the PrefixCacheInfo it
// yields per endpoint, and the PrepareData producers with their dependency
// graph.
package datalayer
