// Package always holds upstream's unconditional deciders:
// always-disagg-pd-decider splits every request's prefill onto a pod of
// its own, and always-disagg-multimodal-decider splits the encoding of
// every request that carries images, audio or video.
package always

import (
	"context"
	"encoding/json"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/plugin"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
)

// The registered type names, upstream's.
const (
	PDType         = "always-disagg-pd-decider"
	MultimodalType = "always-disagg-multimodal-decider"
)

// ReasonTextOnly: the request has no multimodal part to encode.
const ReasonTextOnly = "text-only"

// ReasonMultimodal: the request has multimodal parts to encode.
const ReasonMultimodal = "multimodal"

// PD splits every request.
type PD struct{ name plugin.TypedName }

// Multimodal splits the requests with multimodal parts.
type Multimodal struct{ name plugin.TypedName }

var (
	_ framework.Decider = (*PD)(nil)
	_ framework.Decider = (*Multimodal)(nil)
)

// NewPD makes an always-disagg-pd-decider.
func NewPD(name string) *PD { return &PD{name: plugin.TypedName{Type: PDType, Name: name}} }

// NewMultimodal makes an always-disagg-multimodal-decider.
func NewMultimodal(name string) *Multimodal {
	return &Multimodal{name: plugin.TypedName{Type: MultimodalType, Name: name}}
}

// PDFactory makes an always-disagg-pd-decider; it takes no parameters.
func PDFactory(name string, raw json.RawMessage, _ framework.Handle) (plugin.Plugin, error) {
	var p struct{}
	if err := framework.DecodeParams(PDType, name, raw, &p); err != nil {
		return nil, err
	}
	return NewPD(name), nil
}

// MultimodalFactory makes an always-disagg-multimodal-decider; it takes no
// parameters.
func MultimodalFactory(name string, raw json.RawMessage, _ framework.Handle) (plugin.Plugin, error) {
	var p struct{}
	if err := framework.DecodeParams(MultimodalType, name, raw, &p); err != nil {
		return nil, err
	}
	return NewMultimodal(name), nil
}

// TypedName implements plugin.Plugin.
func (d *PD) TypedName() plugin.TypedName { return d.name }

// Disaggregate implements framework.Decider.
func (d *PD) Disaggregate(context.Context, *framework.CycleState, *request.Request, *datalayer.Candidate) framework.Verdict {
	return framework.Verdict{Split: true, Reason: framework.ReasonAlways}
}

// TypedName implements plugin.Plugin.
func (d *Multimodal) TypedName() plugin.TypedName { return d.name }

// Disaggregate implements framework.Decider. A chat request whose prefix
// cannot be keyed from its text is one with image, audio or video parts
// (the parser marks it so); prompts given as embeddings have nothing left
// to encode.
func (d *Multimodal) Disaggregate(_ context.Context, _ *framework.CycleState, req *request.Request, _ *datalayer.Candidate) framework.Verdict {
	if req.API == request.APIChatCompletions && req.NoReproduciblePrefix {
		return framework.Verdict{Split: true, Reason: ReasonMultimodal}
	}
	return framework.Verdict{Reason: ReasonTextOnly}
}
