// Package prefixinfo reads the PrefixCacheInfo a PrepareData producer
// published on a candidate.
package prefixinfo

import "github.com/kvroute/kvroute/pkg/datalayer"

// Exemplar is the type consumers declare for datalayer.PrefixCacheMatchInfoKey:
// a PrefixCacheInfo value, as the prefix producer publishes it.
var Exemplar = datalayer.PrefixCacheInfo{}

// Get returns the candidate's prefix info. It accepts a pointer as well as a
// value, so that a producer publishing either cannot silently zero every
// score; the copy it returns keeps scoring free of allocations.
func Get(c *datalayer.Candidate) (datalayer.PrefixCacheInfo, bool) {
	v, ok := c.Get(datalayer.PrefixCacheMatchInfoKey)
	if !ok {
		return datalayer.PrefixCacheInfo{}, false
	}
	switch p := v.(type) {
	case datalayer.PrefixCacheInfo:
		return p, true
	case *datalayer.PrefixCacheInfo:
		if p != nil {
			return *p, true
		}
	}
	return datalayer.PrefixCacheInfo{}, false
}
