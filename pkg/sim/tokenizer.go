package sim

import (
	"encoding/json"
	"hash/fnv"
	"strings"
)

// TokenVocab bounds the simulated tokenizer's ids.
const TokenVocab = 50000

// Tokenizer is what an engine needs of its model's tokenizer: a prompt's
// token ids, and a chat's messages rendered by the model's chat template
// into the prompt those ids are taken from. Whoever builds the engine
// chooses it (EngineConfig.Tokenizer); Words is the default.
type Tokenizer interface {
	Encode(text string, addSpecialTokens bool) ([]uint32, error)
	RenderChat(c *Chat) (string, error)
}

// Chat is what a chat request gives the chat template, as the client sent
// it: JSON values are kept raw.
type Chat struct {
	// Messages is the JSON array of message objects; each has a string
	// role, checked by the engine before rendering.
	Messages             json.RawMessage
	Tools                json.RawMessage
	ChatTemplate         string
	ChatTemplateKwargs   json.RawMessage
	AddGenerationPrompt  bool
	ContinueFinalMessage bool
}

// Words is the simulated models' tokenizer: one token per
// whitespace-separated word, a hash of the word below TokenVocab, and no
// special tokens. It only has to be deterministic and prefix-preserving (a
// text's tokens start with those of any word-aligned prefix), which is
// what prefix caching needs from a real one. Its chat template writes each
// message as a line naming its role, then its content.
type Words struct{}

var _ Tokenizer = Words{}

// Encode implements Tokenizer.
func (Words) Encode(text string, _ bool) ([]uint32, error) { return Tokenize(text), nil }

// RenderChat implements Tokenizer. Content parts that are not text render
// as a placeholder naming their type.
func (Words) RenderChat(c *Chat) (string, error) {
	var msgs []struct {
		Role      string          `json:"role"`
		Name      string          `json:"name"`
		Content   json.RawMessage `json:"content"`
		ToolCalls json.RawMessage `json:"tool_calls"`
	}
	if err := json.Unmarshal(c.Messages, &msgs); err != nil {
		return "", err
	}
	var b strings.Builder
	if len(c.Tools) > 0 && string(c.Tools) != "null" {
		b.WriteString("<tools> ")
		b.Write(c.Tools)
		b.WriteString("\n")
	}
	for _, m := range msgs {
		b.WriteString("<" + m.Role)
		if m.Name != "" {
			b.WriteString(" " + m.Name)
		}
		b.WriteString(">\n")
		text, err := contentText(m.Content)
		if err != nil {
			return "", err
		}
		b.WriteString(text)
		if len(m.ToolCalls) > 0 && string(m.ToolCalls) != "null" {
			b.WriteString("\n<tool_calls> ")
			b.Write(m.ToolCalls)
		}
		b.WriteString("\n")
	}
	if c.AddGenerationPrompt && !c.ContinueFinalMessage {
		b.WriteString("<assistant>\n")
	}
	return b.String(), nil
}

// contentText is a message's content as text: a string, nothing for null,
// or its parts' texts in order.
func contentText(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	if raw[0] == '"' {
		var s string
		err := json.Unmarshal(raw, &s)
		return s, err
	}
	var parts []struct {
		Type string  `json:"type"`
		Text *string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", err
	}
	var b strings.Builder
	for _, p := range parts {
		switch {
		case p.Type == "text" || (p.Type == "" && p.Text != nil):
			if p.Text != nil {
				b.WriteString(*p.Text)
			}
		case p.Type == "":
			b.WriteString("<untyped>")
		default:
			b.WriteString("<" + p.Type + ">")
		}
	}
	return b.String(), nil
}

// Tokenize is Words' encoding of s.
func Tokenize(s string) []uint32 {
	ids := make([]uint32, 0, len(s)/4)
	for _, w := range strings.Fields(s) {
		ids = append(ids, wordID(w))
	}
	return ids
}

func wordID(w string) uint32 {
	h := fnv.New32a()
	_, _ = h.Write([]byte(w))
	return h.Sum32() % TokenVocab
}
