package extproc_test

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvroute/kvroute/pkg/requestpath/extproc"
)

// frame encodes messages as the fuzz input: each as a length byte and its
// protobuf encoding (messages over 255 bytes are cut, which is fine: the
// fuzzer explores broken encodings too).
func frame(msgs ...*extprocv3.ProcessingRequest) []byte {
	var out []byte
	for _, m := range msgs {
		b, _ := proto.Marshal(m)
		b = b[:min(len(b), 255)]
		out = append(out, byte(len(b)))
		out = append(out, b...)
	}
	return out
}

func unframe(data []byte) []*extprocv3.ProcessingRequest {
	var msgs []*extprocv3.ProcessingRequest
	for len(data) > 0 && len(msgs) < 64 {
		n := min(int(data[0]), len(data)-1)
		m := &extprocv3.ProcessingRequest{}
		if proto.Unmarshal(data[1:1+n], m) == nil {
			msgs = append(msgs, m)
		}
		data = data[1+n:]
	}
	return msgs
}

// FuzzProcessStream sends arbitrary message sequences, decoded from the
// fuzz input, over a real ext_proc stream. The server must answer only
// with well-formed responses or end the stream, never panic, and never
// refuse with a status outside the request path's set.
func FuzzProcessStream(f *testing.F) {
	withMode := func(m *extprocv3.ProcessingRequest, mode filterv3.ProcessingMode_BodySendMode) *extprocv3.ProcessingRequest {
		m.ProtocolConfig = &extprocv3.ProtocolConfiguration{RequestBodyMode: mode, ResponseBodyMode: mode}
		return m
	}
	subset := func(m *extprocv3.ProcessingRequest, v *structpb.Value) *extprocv3.ProcessingRequest {
		m.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
			"envoy.lb.subset_hint": {Fields: map[string]*structpb.Value{"x-gateway-destination-endpoint-subset": v}},
		}}
		return m
	}
	respHeaders := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
		Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":status", RawValue: []byte("200")}, {Key: "content-type", RawValue: []byte("text/event-stream")}}},
	}}}
	respBody := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{
		Body: []byte("data: {\"usage\":{\"prompt_tokens\":3}}\n\ndata: [DONE]\n\n"), EndOfStream: true,
	}}}
	body := []byte(`{"model":"m","prompt":[1,2,3]}`)
	for _, seed := range [][]byte{
		frame(headersOnly("/v1/completions"), bodyChunk(body, true), respHeaders, respBody),
		frame(headersOnly("/v1/completions"), bodyChunk(body[:7], false), bodyChunk(body[7:], true)),
		frame(withMode(headersOnly("/v1/completions"), filterv3.ProcessingMode_BUFFERED), bodyChunk(body, true), respHeaders, respBody),
		frame(withMode(headersOnly("/v1/completions"), filterv3.ProcessingMode_STREAMED), bodyChunk(body, true)),
		frame(withMode(headersOnly("/v1/models"), filterv3.ProcessingMode_NONE)),
		frame(subset(headersOnly("/v1/completions"), structpb.NewNumberValue(1)), bodyChunk(body, true)),
		frame(subset(headersOnly("/v1/completions"), structpb.NewStringValue("10.0.0.1:8000")), bodyChunk(body, true)),
		frame(headersOnly("/v1/completions"), &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestTrailers{RequestTrailers: &extprocv3.HttpTrailers{}}}),
		frame(bodyChunk(body, true), headersOnly("/v1/completions"), headersOnly("/v1/completions")),
		frame(respBody, respHeaders),
		{3, 0xff, 0xff, 0xff},
	} {
		f.Add(seed)
	}
	_, c, _ := startServer(f, plainDirector(f, 2), extproc.Options{Plaintext: true, MaxBodyBytes: 1024})
	// The refusals a client can earn: a bad request, a model the pool does
	// not serve (as vLLM answers it), a body too large or too late, load
	// shed, the body budget spent.
	allowed := map[int32]bool{400: true, 404: true, 408: true, 413: true, 429: true, 500: true, 503: true}
	f.Fuzz(func(t *testing.T, data []byte) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		ps, err := c.Process(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range unframe(data) {
			if ps.Send(m) != nil {
				break
			}
		}
		_ = ps.CloseSend()
		for {
			r, err := ps.Recv()
			if errors.Is(err, io.EOF) {
				return
			}
			if err != nil {
				if ctx.Err() != nil {
					t.Fatal("the server neither answered nor ended the stream")
				}
				return // the server ended the stream with an error status
			}
			if r.Response == nil {
				t.Fatalf("a response with no content: %v", r)
			}
			if ir := r.GetImmediateResponse(); ir != nil && !allowed[int32(ir.GetStatus().GetCode())] {
				t.Fatalf("refused with status %d", ir.GetStatus().GetCode())
			}
		}
	})
}
