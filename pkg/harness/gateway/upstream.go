package gateway

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"syscall"
)

// hopByHop are the headers a proxy does not forward (RFC 9110 7.6.1).
var hopByHop = map[string]bool{
	"connection": true, "keep-alive": true, "proxy-connection": true, "te": true,
	"trailer": true, "transfer-encoding": true, "upgrade": true, "content-length": true,
}

// HTTPUpstream is an Upstream that sends the request over HTTP with client,
// streaming the response body back as it arrives. The response body is
// closed when ctx ends or the exchange has read it all.
func HTTPUpstream(client *http.Client) Upstream {
	return func(ctx context.Context, target, path string, headers map[string]string, body []byte) (*Response, error) {
		method := headers[":method"]
		req, err := http.NewRequestWithContext(ctx, method, "http://"+target+path, bytes.NewReader(body))
		if err != nil {
			return nil, err
		}
		for k, v := range headers {
			if strings.HasPrefix(k, ":") || hopByHop[k] {
				continue
			}
			req.Header.Set(k, v)
		}
		resp, err := client.Do(req)
		if err != nil {
			return nil, err
		}
		go func() { <-ctx.Done(); resp.Body.Close() }()
		h := make(map[string]string, len(resp.Header))
		for k, vs := range resp.Header {
			k = strings.ToLower(k)
			if len(vs) > 0 && !hopByHop[k] && k != "content-type" {
				h[k] = vs[0]
			}
		}
		return &Response{
			Status: resp.StatusCode, ContentType: resp.Header.Get("Content-Type"), Header: h,
			Reader: resp.Body, Served: target, Trailers: len(resp.Trailer) > 0,
		}, nil
	}
}

// Kinds of upstream failure, as the gateway's metrics count them.
const (
	FailureRefused       = "connect_refused"
	FailureTimeout       = "connect_timeout"
	FailureReset         = "reset"
	FailureNoDestination = "no_destination"
)

// failureKind classifies why an upstream could not be reached.
func failureKind(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return FailureRefused
	case errors.As(err, &ne) && ne.Timeout():
		return FailureTimeout
	}
	return FailureReset
}
