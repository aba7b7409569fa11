// Package prefixinfo holds what the scheduling plugins that read a
// candidate's PrefixCacheInfo declare they consume.
package prefixinfo

import "github.com/kvroute/kvroute/pkg/datalayer"

// Exemplar is the type consumers declare for datalayer.PrefixCacheMatchInfoKey:
// a PrefixCacheInfo value, as the prefix producer publishes it (read with
// datalayer.PrefixCacheInfoOf).
var Exemplar = datalayer.PrefixCacheInfo{}
