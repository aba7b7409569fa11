// Package prefixquery is the question and answer of the EPP's /debug/prefix
// ("who holds this prompt, and what would PrepareData tell the scheduler?"),
// shared by the EPP that answers it and by kvctl, which asks it without
// linking the EPP.
package prefixquery

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/kvroute/kvroute/pkg/datalayer"
)

// Query is a /debug/prefix question. It comes as a JSON body (POST) or as
// query parameters (GET, token_ids comma-separated).
type Query struct {
	Model     string   `json:"model"`
	LoRA      string   `json:"lora,omitempty"`
	CacheSalt string   `json:"cache_salt,omitempty"`
	TokenIDs  []uint32 `json:"token_ids"`
}

// Answer is every candidate endpoint's PrefixCacheInfo for a Query, as the
// PrepareData producers the scheduler runs computed it.
type Answer struct {
	Model     string     `json:"model"`
	Tokens    int        `json:"tokens"`
	Endpoints []Endpoint `json:"endpoints"`
}

// Endpoint is one endpoint's part of an Answer.
type Endpoint struct {
	Name    string                    `json:"name"`
	Address string                    `json:"address"`
	Model   string                    `json:"model"`
	Stream  datalayer.StreamState     `json:"stream"`
	Prefix  datalayer.PrefixCacheInfo `json:"prefix"`
}

// ParseTokenList parses comma-separated token ids ("1,2,3"; spaces allowed).
func ParseTokenList(s string) ([]uint32, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, nil
	}
	parts := strings.Split(s, ",")
	out := make([]uint32, 0, len(parts))
	for i, p := range parts {
		v, err := strconv.ParseUint(strings.TrimSpace(p), 10, 32)
		if err != nil {
			// The value itself is not quoted: it may be as long as the query.
			return nil, fmt.Errorf("token id %d (%d bytes): not a non-negative 32-bit integer", i, len(p))
		}
		out = append(out, uint32(v))
	}
	return out, nil
}
