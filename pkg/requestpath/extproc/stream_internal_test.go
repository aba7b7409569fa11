package extproc

import (
	"errors"
	"slices"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvroute/kvroute/pkg/requestpath/director"
)

func hint(v *structpb.Value) *corev3.Metadata {
	return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
		"envoy.lb.subset_hint": {Fields: map[string]*structpb.Value{"x-gateway-destination-endpoint-subset": v}},
	}}
}

func list(vs ...*structpb.Value) *structpb.Value {
	return structpb.NewListValue(&structpb.ListValue{Values: vs})
}

func TestSubsetHintReading(t *testing.T) {
	t.Parallel()
	s := structpb.NewStringValue
	tests := []struct {
		name string
		md   *corev3.Metadata
		want []string
		err  error // nil, errEmptySubset, or errAny for another error
	}{
		{"no metadata means no restriction", nil, nil, nil},
		{"another namespace means no restriction", &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{"x": {}}}, nil, nil},
		{"a list of addresses", hint(list(s("1.1.1.1:80"), s("2.2.2.2:80"))), []string{"1.1.1.1:80", "2.2.2.2:80"}, nil},
		{"a comma-separated string with spaces", hint(s(" 1.1.1.1:80 ,2.2.2.2:80,")), []string{"1.1.1.1:80", "2.2.2.2:80"}, nil},
		{"list entries that are themselves lists of addresses", hint(list(s("1.1.1.1:80,2.2.2.2:80"), s("3.3.3.3:80"))), []string{"1.1.1.1:80", "2.2.2.2:80", "3.3.3.3:80"}, nil},
		{"an empty list allows nothing", hint(list()), nil, errEmptySubset},
		{"a blank string allows nothing", hint(s(" , ")), nil, errEmptySubset},
		{"a number is malformed", hint(structpb.NewNumberValue(3)), nil, errAny},
		{"a list holding a number is malformed", hint(list(s("1.1.1.1:80"), structpb.NewNumberValue(3))), nil, errAny},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := subsetHint(tt.md)
			switch {
			case tt.err == nil && err != nil, tt.err != nil && err == nil:
				t.Fatalf("err = %v, want %v", err, tt.err)
			case tt.err == errEmptySubset && !errors.Is(err, errEmptySubset):
				t.Fatalf("err = %v, want errEmptySubset", err)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("subset = %q, want %q", got, tt.want)
			}
		})
	}
}

var errAny = errors.New("any error")

func TestHeaderValuesComeFromRawValueOrValue(t *testing.T) {
	t.Parallel()
	got := headerMap(&corev3.HeaderMap{Headers: []*corev3.HeaderValue{
		{Key: ":Path", RawValue: []byte("/v1/completions")},
		{Key: "X-Request-Id", Value: "abc"},
		{Key: "both", Value: "old", RawValue: []byte("new")},
	}})
	want := map[string]string{":path": "/v1/completions", "x-request-id": "abc", "both": "new"}
	if len(got) != len(want) {
		t.Fatalf("headers %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
}

func TestABodyWholeInOneMessageIsKeptAndChunksAreGathered(t *testing.T) {
	t.Parallel()
	newStream := func() *stream {
		return &stream{s: &Server{o: Options{MaxBodyBytes: 1 << 20}},
			in: director.Input{Headers: map[string]string{"content-length": "10"}}}
	}

	// Whole in one message: kept as decoded, not copied.
	one := []byte("0123456789")
	st := newStream()
	st.gather(one, true)
	if string(st.body) != "0123456789" || &st.body[0] != &one[0] {
		t.Fatalf("a one-message body was copied (or changed): %q", st.body)
	}

	// In chunks: gathered into a buffer from BufferPool, so that no
	// chunk's memory is the body's.
	chunks := [][]byte{[]byte("0123"), []byte("456"), []byte("789")}
	st = newStream()
	for i, c := range chunks {
		st.gather(c, i == len(chunks)-1)
	}
	if string(st.body) != "0123456789" {
		t.Fatalf("gathered %q, want 0123456789", st.body)
	}
	for _, c := range chunks {
		c[0] = 'x'
	}
	if string(st.body) != "0123456789" {
		t.Fatalf("the gathered body shares a chunk's memory: %q", st.body)
	}
	if st.bodyBuf == nil || len(*st.bodyBuf) != 10 || &st.body[0] != &(*st.bodyBuf)[0] {
		t.Errorf("the body is not gathered in a pooled buffer of Content-Length's 10 bytes")
	}
	// Once the request is over and nothing the director ran can outlive
	// it, the buffer goes back and the stream keeps nothing of it.
	st.in.Body, st.pick = st.body, &director.Pick{}
	st.releaseMemory()
	if st.bodyBuf != nil || st.in.Body != nil {
		t.Errorf("after the request, the stream still holds its body's buffer")
	}

	// An empty first chunk gathers nothing: the next, ending the body, is
	// then the whole of it.
	last := []byte("abc")
	st = newStream()
	st.in.Headers = nil
	st.gather(nil, false)
	st.gather(last, true)
	if string(st.body) != "abc" || &st.body[0] != &last[0] {
		t.Fatalf("after an empty chunk, body %q (copied: %v)", st.body, len(st.body) > 0 && &st.body[0] != &last[0])
	}
}
