package events

import (
	"errors"
	"regexp"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
)

func TestSubject(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name                 string
		namespace, pool, pod string
		want                 string
	}{
		{"plain names pass through", "prod", "llama-pool", "vllm-0", "kv.events.prod.llama-pool.vllm-0"},
		{"dots cannot add subject levels", "a.b", "p", "x.y.z", "kv.events.a_b.p.x_y_z"},
		{"wildcards are neutralised", "*", ">", "pod*", "kv.events._._.pod_"},
		{"empty tokens become an underscore", "", "", "", "kv.events._._._"},
		{"spaces and colons are replaced", "ns", "p", "10.0.0.1:8000 x", "kv.events.ns.p.10_0_0_1_8000_x"},
		{"each byte of a multi-byte rune is replaced", "ns", "p", "é", "kv.events.ns.p.__"},
		{"underscores and dashes are kept", "n_s", "p-1", "A_b-9", "kv.events.n_s.p-1.A_b-9"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := Subject(tt.namespace, tt.pool, tt.pod); got != tt.want {
				t.Errorf("Subject(%q, %q, %q) = %q, want %q", tt.namespace, tt.pool, tt.pod, got, tt.want)
			}
		})
	}
}

func TestPoolSubjectCoversEveryPodSubject(t *testing.T) {
	t.Parallel()
	if got, want := PoolSubject("prod", "a.b"), "kv.events.prod.a_b.>"; got != want {
		t.Fatalf("PoolSubject = %q, want %q", got, want)
	}
	pool := strings.TrimSuffix(PoolSubject("ns", "pool"), ">")
	for _, pod := range []string{"vllm-0", "a.b.c", "", "*"} {
		if s := Subject("ns", "pool", pod); !strings.HasPrefix(s, pool) || strings.Count(s, ".") != 4 {
			t.Errorf("Subject for pod %q = %q, not one level under %q", pod, s, pool)
		}
	}
}

func TestOriginHeaderRoundTrips(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		o    Origin
	}{
		{"a full origin", Origin{Stream: Stream{Endpoint: "10.1.2.3:8000", DPRank: 3}, Pod: "vllm-7", Model: "meta/llama-3", Instance: "c0ffee", BlockSize: 16, Seq: 1<<64 - 1}},
		{"a minimal origin", Origin{Stream: Stream{Endpoint: "[fd00::1]:9000"}}},
		{"a host-name endpoint", Origin{Stream: Stream{Endpoint: "vllm-0.vllm.svc:8000"}, Seq: 42}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := ParseOrigin(tt.o.Header())
			if err != nil {
				t.Fatalf("ParseOrigin: %v", err)
			}
			if got != tt.o {
				t.Errorf("round trip = %+v, want %+v", got, tt.o)
			}
		})
	}
}

func TestOriginHeaderLeavesOutEmptyOptionalValues(t *testing.T) {
	t.Parallel()
	h := Origin{Stream: Stream{Endpoint: "10.0.0.1:8000"}, Seq: 1}.Header()
	for _, k := range []string{HeaderPod, HeaderModel, HeaderInstance, HeaderBlockSize} {
		if _, ok := h[k]; ok {
			t.Errorf("header %s sent although empty", k)
		}
	}
}

func TestParseOrigin(t *testing.T) {
	t.Parallel()
	good := func() nats.Header {
		return nats.Header{
			HeaderEndpoint: {"10.0.0.1:8000"}, HeaderSeq: {"7"}, HeaderDPRank: {"1"},
			HeaderInstance: {"i1"}, HeaderBlockSize: {"16"}, HeaderPod: {"p"}, HeaderModel: {"m"},
		}
	}
	with := func(k, v string) nats.Header { h := good(); h.Set(k, v); return h }
	without := func(k string) nats.Header { h := good(); h.Del(k); return h }
	tests := []struct {
		name    string
		h       nats.Header
		wantErr bool
		want    Origin
	}{
		{name: "all headers parse", h: good(), want: Origin{Stream: Stream{Endpoint: "10.0.0.1:8000", DPRank: 1}, Pod: "p", Model: "m", Instance: "i1", BlockSize: 16, Seq: 7}},
		{name: "optional headers default to zero", h: nats.Header{HeaderEndpoint: {"10.0.0.1:8000"}, HeaderSeq: {"0"}}, want: Origin{Stream: Stream{Endpoint: "10.0.0.1:8000"}}},
		{name: "header names are matched case-insensitively as a fallback", h: nats.Header{"kv-endpoint": {"10.0.0.1:8000"}, "KV-SEQ": {"5"}, "Kv-Dp-Rank": {"2"}}, want: Origin{Stream: Stream{Endpoint: "10.0.0.1:8000", DPRank: 2}, Seq: 5}},
		{name: "no headers at all is an error", h: nil, wantErr: true},
		{name: "a missing endpoint is an error", h: without(HeaderEndpoint), wantErr: true},
		{name: "a missing seq is an error", h: without(HeaderSeq), wantErr: true},
		{name: "an endpoint without a port is an error", h: with(HeaderEndpoint, "10.0.0.1"), wantErr: true},
		{name: "an endpoint with port 0 is an error", h: with(HeaderEndpoint, "10.0.0.1:0"), wantErr: true},
		{name: "an endpoint with a port out of range is an error", h: with(HeaderEndpoint, "10.0.0.1:70000"), wantErr: true},
		{name: "an endpoint with a bad host is an error", h: with(HeaderEndpoint, "bad host:80"), wantErr: true},
		{name: "an empty endpoint is an error", h: with(HeaderEndpoint, ""), wantErr: true},
		{name: "a negative seq is an error", h: with(HeaderSeq, "-1"), wantErr: true},
		{name: "a seq beyond uint64 is an error", h: with(HeaderSeq, "18446744073709551616"), wantErr: true},
		{name: "a non-numeric seq is an error", h: with(HeaderSeq, "seven"), wantErr: true},
		{name: "a negative rank is an error", h: with(HeaderDPRank, "-1"), wantErr: true},
		{name: "a non-numeric rank is an error", h: with(HeaderDPRank, "x"), wantErr: true},
		{name: "a negative block size is an error", h: with(HeaderBlockSize, "-16"), wantErr: true},
		{name: "a huge block size is an error", h: with(HeaderBlockSize, "99999999999"), wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := ParseOrigin(tt.h)
			if tt.wantErr {
				if !errors.Is(err, ErrBadHeader) {
					t.Fatalf("ParseOrigin error = %v, want ErrBadHeader", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseOrigin: %v", err)
			}
			if got != tt.want {
				t.Errorf("ParseOrigin = %+v, want %+v", got, tt.want)
			}
		})
	}
}

var tokenRE = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

func FuzzSubject(f *testing.F) {
	for _, s := range []string{"", "vllm-0", "a.b", "*", ">", "é", "\x00", "10.0.0.1:8000"} {
		f.Add(s, s, s)
	}
	f.Fuzz(func(t *testing.T, ns, pool, pod string) {
		tokens := strings.Split(Subject(ns, pool, pod), ".")
		if len(tokens) != 5 || tokens[0] != "kv" || tokens[1] != "events" {
			t.Fatalf("Subject(%q, %q, %q) has the wrong shape: %q", ns, pool, pod, tokens)
		}
		for _, tok := range tokens[2:] {
			if !tokenRE.MatchString(tok) {
				t.Fatalf("token %q is not sanitised", tok)
			}
		}
	})
}

func FuzzParseOrigin(f *testing.F) {
	f.Add("10.0.0.1:8000", "0", "0", "16", "inst", "pod", "model")
	f.Add("[::1]:1", "18446744073709551615", "7", "0", "", "", "")
	f.Add("host.example:65535", "12", "", "", "x", "", "")
	f.Add("", "", "-1", "abc", "", "", "")
	f.Add("a:b:c", "1e3", "2147483648", "+1", "", "", "")
	f.Fuzz(func(t *testing.T, ep, seq, rank, bs, inst, pod, model string) {
		h := nats.Header{HeaderEndpoint: {ep}, HeaderSeq: {seq}, HeaderInstance: {inst}, HeaderPod: {pod}, HeaderModel: {model}}
		if rank != "" {
			h.Set(HeaderDPRank, rank)
		}
		if bs != "" {
			h.Set(HeaderBlockSize, bs)
		}
		o, err := ParseOrigin(h)
		if err != nil {
			if !errors.Is(err, ErrBadHeader) {
				t.Fatalf("error %v does not wrap ErrBadHeader", err)
			}
			return
		}
		if o.DPRank < 0 || o.BlockSize < 0 {
			t.Fatalf("accepted negative values: %+v", o)
		}
		// What parsed must survive a round trip through the publisher's side.
		back, err := ParseOrigin(o.Header())
		if err != nil {
			t.Fatalf("re-parse of %+v: %v", o, err)
		}
		if back != o {
			t.Fatalf("round trip changed %+v into %+v", o, back)
		}
	})
}
