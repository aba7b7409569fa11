package epp_test

import (
	"testing"

	"github.com/kvroute/kvroute/pkg/epp"
)

func TestRequestPathBudgetsFitTheMemoryTheProcessMayUse(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name           string
		memory         int64
		maxBody        int
		bytes          int64
		streams        int
		withinAnEighth bool
	}{
		{"the chart's 2 GiB: 256 MiB of bodies and 4096 streams", 2 << 30, 16 << 20, 256 << 20, 4096, true},
		{"the 4 GiB fallback: twice that", 4 << 30, 16 << 20, 512 << 20, 8192, true},
		{"a small container still holds one largest body decoded, and some streams", 256 << 20, 16 << 20, 160 << 20, 512, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			bytes, streams := epp.RequestPathBudgets(tt.memory, tt.maxBody)
			if bytes != tt.bytes || streams != tt.streams {
				t.Errorf("RequestPathBudgets(%d, %d) = %d, %d; want %d, %d", tt.memory, tt.maxBody, bytes, streams, tt.bytes, tt.streams)
			}
			if tt.withinAnEighth && bytes+int64(streams)*epp.BytesPerStream > tt.memory/8+tt.memory/16 {
				t.Errorf("bodies and streams take %d bytes of %d", bytes+int64(streams)*epp.BytesPerStream, tt.memory)
			}
		})
	}
}

func TestExtProcConnectionsFitTheirShareOfMemory(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		memory int64
		conns  int
	}{
		{"the chart's 2 GiB: 256 connections", 2 << 30, 256},
		{"the 4 GiB fallback: twice that", 4 << 30, 512},
		{"a small container still takes a gateway's worker threads", 256 << 20, 64},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := epp.ExtProcConns(tt.memory); got != tt.conns {
				t.Errorf("ExtProcConns(%d) = %d, want %d", tt.memory, got, tt.conns)
			}
		})
	}
}
