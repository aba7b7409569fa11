package main

import (
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/epp"
)

func TestWithoutFlagsTheEPPRunsWithItsDefaultOptions(t *testing.T) {
	t.Setenv("NATS_URL", "")
	t.Setenv("NAMESPACE", "")
	got, err := parse(nil)
	if err != nil {
		t.Fatal(err)
	}
	if got.Logger == nil {
		t.Error("no logger")
	}
	got.Logger = nil
	if want := epp.DefaultOptions(); !reflect.DeepEqual(got, want) {
		t.Errorf("without flags:\n%+v\nwant epp.DefaultOptions():\n%+v", got, want)
	}
}

func TestEachFlagSetsItsOption(t *testing.T) {
	tests := []struct {
		name string
		args []string
		env  map[string]string
		ok   func(o epp.Options) bool
	}{
		{"--recovery=false turns recovery off", []string{"--recovery=false"}, nil,
			func(o epp.Options) bool { return o.NoRecovery && !o.NoSelfCheck }},
		{"--self-check=false turns the self-check off", []string{"--self-check=false"}, nil,
			func(o epp.Options) bool { return o.NoSelfCheck && !o.NoRecovery }},
		{"--outlier-detection=false turns outlier detection off", []string{"--outlier-detection=false"}, nil,
			func(o epp.Options) bool { return o.OutlierDetection.Disabled && !o.NoSelfCheck }},
		{"--outlier-* set outlier detection's parameters", []string{"--outlier-consecutive-5xx", "3", "--outlier-base-ejection-time", "5s",
			"--outlier-max-ejection-percent", "20", "--outlier-peak-prefill-rate", "50000"}, nil,
			func(o epp.Options) bool {
				od := o.OutlierDetection
				return !od.Disabled && od.Consecutive5xx == 3 && od.BaseEjectionTime == 5*time.Second &&
					od.MaxEjectionPercent == 20 && od.PeakPrefillRate == 50000 && od.ProbationSuccesses == 5
			}},
		{"--extproc-* set ext_proc's connection bounds", []string{"--extproc-max-conns", "32", "--extproc-window-bytes", "131072",
			"--extproc-max-message-bytes", "4194304", "--extproc-idle-timeout", "30s"}, nil,
			func(o epp.Options) bool {
				x := o.RequestPath.ExtProc
				return x.MaxConns == 32 && x.WindowBytes == 128<<10 && x.MaxMessageBytes == 4<<20 && x.IdleTimeout == 30*time.Second &&
					x.MaxStreamsPerConn == epp.DefaultOptions().RequestPath.ExtProc.MaxStreamsPerConn
			}},
		{"--proxy-prefill-* set what the proxy does with a split request's prefill leg", []string{"--proxy-prefill-failure", "decode-only", "--proxy-prefill-timeout", "45s"}, nil,
			func(o epp.Options) bool {
				return o.RequestPath.Proxy.PrefillFailure.String() == "decode-only" && o.RequestPath.Proxy.PrefillTimeout == 45*time.Second
			}},
		{"the proxy refuses a split request whose prefill failed by default", nil, nil,
			func(o epp.Options) bool { return o.RequestPath.Proxy.PrefillFailure.String() == "refuse" }},
		{"--emit-endpoint-scores adds the scores to ext_proc's metadata", []string{"--emit-endpoint-scores"}, nil,
			func(o epp.Options) bool { return o.RequestPath.ExtProc.EmitEndpointScores }},
		{"scores are not emitted by default", nil, nil,
			func(o epp.Options) bool { return !o.RequestPath.ExtProc.EmitEndpointScores }},
		{"--secure-serving=false serves ext_proc in plaintext", []string{"--secure-serving=false"}, nil,
			func(o epp.Options) bool { return o.RequestPath.Plaintext }},
		{"--cert-path names the key pair's directory", []string{"--cert-path", "/certs"}, nil,
			func(o epp.Options) bool {
				return o.RequestPath.CertFile == "/certs/tls.crt" && o.RequestPath.KeyFile == "/certs/tls.key"
			}},
		{"--index-cpu-max-age bounds the CPU tier alone", []string{"--index-cpu-max-age", "5m"}, nil,
			func(o epp.Options) bool {
				return o.Index.TierMaxAge[epp.TierCPU] == 5*time.Minute && o.Index.TierMaxAge[epp.TierStorage] == 0 &&
					o.Index.TierMaxAge[epp.TierGPU] == 0
			}},
		{"--index-storage-max-age bounds the storage tier", []string{"--index-storage-max-age", "1h"}, nil,
			func(o epp.Options) bool { return o.Index.TierMaxAge[epp.TierStorage] == time.Hour }},
		{"--refresh-metrics-interval is the scrape interval", []string{"--refresh-metrics-interval", "1s"}, nil,
			func(o epp.Options) bool { return o.ScrapeOptions.Interval == time.Second }},
		{"--tokenizer repeats", []string{"--tokenizer", "a=/x", "--tokenizer", "b=/y"}, nil,
			func(o epp.Options) bool { return slices.Equal(o.RequestPath.TokenizerFiles, []string{"a=/x", "b=/y"}) }},
		{"--endpoint-selector implies Kubernetes discovery", []string{"--endpoint-selector", "app=vllm"}, nil,
			func(o epp.Options) bool { return o.Discovery != nil }},
		{"--kubernetes turns discovery on", []string{"--kubernetes"}, nil,
			func(o epp.Options) bool { return o.Discovery != nil }},
		{"no discovery without either", nil, nil,
			func(o epp.Options) bool { return o.Discovery == nil }},
		{"--config-name names a configuration", []string{"--config-name", "upstream-weights"}, nil,
			func(o epp.Options) bool { return o.ConfigName == "upstream-weights" && o.ConfigText == "" }},
		{"NAMESPACE is the pool's namespace", nil, map[string]string{"NAMESPACE": "ns"},
			func(o epp.Options) bool { return o.Namespace == "ns" }},
		{"--pool-namespace wins over NAMESPACE", []string{"--pool-namespace", "flag"}, map[string]string{"NAMESPACE": "ns"},
			func(o epp.Options) bool { return o.Namespace == "flag" }},
		{"NATS_URL is the NATS server", nil, map[string]string{"NATS_URL": "nats://n:4222"},
			func(o epp.Options) bool { return o.NATSURL == "nats://n:4222" }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("NATS_URL", "")
			t.Setenv("NAMESPACE", "")
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			o, err := parse(tt.args)
			if err != nil {
				t.Fatal(err)
			}
			if !tt.ok(o) {
				t.Errorf("%v: options %+v", tt.args, o)
			}
		})
	}
}

func TestFlagsThatContradictEachOtherAreRefused(t *testing.T) {
	for _, args := range [][]string{
		{"--config-name", "upstream-weights", "--config-text", "plugins: []"},
		{"--config-name", "upstream-weights", "--config-file", "/x.yaml"},
		{"--log-level", "loud"},
		{"--proxy-prefill-failure", "fallback"},
		{"--no-such-flag"},
	} {
		if _, err := parse(args); err == nil {
			t.Errorf("%v: parsed", args)
		}
	}
}
