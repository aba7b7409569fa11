// Package datalayer is what the scheduler knows about endpoints: the endpoints
// of the pool with their scraped metrics and event-stream state, the datastore
// that holds them and hands out a request's candidates, and the data
// PrepareData producers publish on each candidate (PrefixCacheInfo, under the
// upstream key). The index, the approximate fallback and the scraper that fill
// it are its subpackages.
package datalayer
