package director_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/kvroute/kvroute/pkg/requestpath/director"
)

func TestEchoKeepsShortValuesAndCutsLongOnesAtACharacter(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, in, want string
	}{
		{"a short value is whole", "llama-3-8b", "llama-3-8b"},
		{"a value of exactly the limit is whole", strings.Repeat("a", director.MaxEcho), strings.Repeat("a", director.MaxEcho)},
		{"a long value is cut and says its length", strings.Repeat("a", 100000), strings.Repeat("a", director.MaxEcho) + "…(100000 bytes)"},
		{"a cut never splits a character", strings.Repeat("a", director.MaxEcho-1) + "éééé", strings.Repeat("a", director.MaxEcho-1) + "…(71 bytes)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := director.Echo(tt.in)
			if got != tt.want || !utf8.ValidString(got) {
				t.Errorf("Echo = %q, want %q", got, tt.want)
			}
		})
	}
}

// Error bodies quote what the client sent, never more than MaxEcho bytes
// of it: a 100 KB model name or a 5,000-digit SLO comes back as its start
// and its length.
func TestErrorBodiesQuoteHostileValuesShortened(t *testing.T) {
	t.Parallel()
	d, _, _ := newDirector(t, nil)
	tests := []struct {
		name    string
		headers map[string]string
		model   string
		status  int
		length  string
	}{
		{"a 100 KB model name", nil, strings.Repeat("m", 100000), http.StatusNotFound, "…(100000 bytes)"},
		{"a 5,000-digit SLO", map[string]string{director.HeaderSLOTTFT: strings.Repeat("9", 5000)}, "m", http.StatusBadRequest, "…(5000 bytes)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := d.HandleRequest(context.Background(), &director.Input{
				Path: "/v1/completions", Headers: tt.headers, Body: []byte(`{"model":"` + tt.model + `","prompt":"hello"}`),
			})
			if director.StatusOf(err) != tt.status {
				t.Fatalf("err = %v, want status %d", err, tt.status)
			}
			body := director.ErrorBody(tt.status, err)
			if len(body) > 512 || !strings.Contains(string(body), tt.length) {
				t.Errorf("error body of %d bytes: %s; want under 512, naming the value's length %q", len(body), body, tt.length)
			}
		})
	}
}

// SLO headers that cannot be a target are refused as malformed (400):
// below 1 ms, not a number, not finite, negative, or absurdly long.
func TestSLOHeadersThatCannotBeATargetAreRefused(t *testing.T) {
	t.Parallel()
	d, _, _ := newDirector(t, nil)
	for _, tt := range []struct {
		value string
		ok    bool
	}{
		{"1e-300", false},
		{"0.5", false},
		{"0", false},
		{"-1", false},
		{"NaN", false},
		{"Inf", false},
		{"-Inf", false},
		{"1e10", false},
		{"1." + strings.Repeat("0", 40), false},
		{strings.Repeat("9", 5000), false},
		{"1", true},
		{"250.5", true},
		{"1e3", true},
	} {
		for _, h := range []string{director.HeaderSLOTTFT, director.HeaderSLOTPOT} {
			_, err := d.HandleRequest(context.Background(), &director.Input{
				Path: "/v1/completions", Headers: map[string]string{h: tt.value}, Body: []byte(`{"model":"m","prompt":"hello"}`),
			})
			if tt.ok && err != nil {
				t.Errorf("%s: %s refused: %v", h, director.Echo(tt.value), err)
			}
			if !tt.ok && (director.StatusOf(err) != http.StatusBadRequest || !strings.Contains(err.Error(), h)) {
				t.Errorf("%s: %s: err = %v, want a 400 naming the header", h, director.Echo(tt.value), err)
			}
		}
	}
}

// FuzzSLOHeader sends any value as an SLO header: the request is either
// routed with an SLO from 1 ms to 1e9 ms, or refused with a 400 whose
// body stays short.
func FuzzSLOHeader(f *testing.F) {
	for _, seed := range []string{"250", " 20 ", "1e-300", "NaN", "-Inf", "0x1p4", "1_000", strings.Repeat("9", 5000)} {
		f.Add(seed)
	}
	d, _, _ := newDirector(f, nil)
	f.Fuzz(func(t *testing.T, v string) {
		p, err := d.HandleRequest(context.Background(), &director.Input{
			Path: "/v1/completions", Headers: map[string]string{director.HeaderSLOTTFT: v}, Body: []byte(`{"model":"m","prompt":"hello"}`),
		})
		if err != nil {
			if director.StatusOf(err) != http.StatusBadRequest {
				t.Fatalf("%q: %v, want a 400", v, err)
			}
			if body := director.ErrorBody(http.StatusBadRequest, err); len(body) > 512 {
				t.Fatalf("%q: an error body of %d bytes", v, len(body))
			}
			return
		}
		if slo := p.Request.SLO.TTFT; slo < time.Millisecond || slo > 1e9*time.Millisecond {
			t.Fatalf("%q accepted as an SLO of %v", v, slo)
		}
		d.HandleResponse(p, director.Served{Status: 200})
	})
}
