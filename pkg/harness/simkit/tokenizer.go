package simkit

import (
	"context"

	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/requestpath/tokenize"
	"github.com/kvroute/kvroute/pkg/sim"
)

// Tokenizer is a simulated model's tokenizer on the EPP's request path,
// for the model Model: an EPP given it tokenizes the simulated engines'
// requests in process, as a deployment gives its EPP the model's
// tokenizer files, instead of asking an engine's /tokenize. A chat's
// prompt is its messages rendered by the model's chat template, from the
// request as the client sent it.
type Tokenizer struct {
	Model string
	// Engine is the model's tokenizer, the one its engines are given (nil:
	// sim.Words).
	Engine sim.Tokenizer
}

var _ tokenize.Tokenizer = Tokenizer{}

// Tokenize implements tokenize.Tokenizer.
func (t Tokenizer) Tokenize(_ context.Context, req *request.Request) ([]uint32, error) {
	if req.Model != t.Model || req.NoReproduciblePrefix {
		return nil, tokenize.ErrUnsupported
	}
	tok := t.Engine
	if tok == nil {
		tok = sim.Words{}
	}
	text := req.Prompt
	switch {
	case req.Chat != nil:
		c := req.Chat
		var err error
		text, err = tok.RenderChat(&sim.Chat{
			Messages: c.Messages, Tools: c.Tools, ChatTemplate: c.ChatTemplate, ChatTemplateKwargs: c.ChatTemplateKwargs,
			AddGenerationPrompt: c.AddGenerationPrompt, ContinueFinalMessage: c.ContinueFinalMessage,
		})
		if err != nil {
			return nil, err
		}
	case text == "":
		return nil, tokenize.ErrUnsupported
	}
	return tok.Encode(text, req.AddSpecialTokens)
}
