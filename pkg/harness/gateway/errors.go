package gateway

import "errors"

// ErrEnvoyWouldReject is wrapped by errors about answers Envoy would not
// accept (out of order, the wrong kind, a body answer in the wrong shape).
var ErrEnvoyWouldReject = errors.New("answer Envoy would reject")

// ErrStreamOpen is wrapped by errors opening an ext_proc stream: nothing
// of the request reached the server, so the stream may be tried on
// another host.
var ErrStreamOpen = errors.New("ext_proc stream not opened")

// ErrNoHost is returned when the ext_proc cluster has no host at all.
var ErrNoHost = errors.New("no ext_proc host")

// ErrHostExists and ErrUnknownHost are returned by AddHost and RemoveHost.
var (
	ErrHostExists  = errors.New("ext_proc host already in the cluster")
	ErrUnknownHost = errors.New("no such ext_proc host")
)

// ErrUpstreamCut is wrapped by errors reading an upstream's response body
// after its headers: the response is cut.
var ErrUpstreamCut = errors.New("upstream response cut")
