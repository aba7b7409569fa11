package sim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
)

// The engine serves Anthropic's Messages and OpenAI's Responses APIs as
// vLLM does: each request becomes chat messages, which its chat template
// renders as it renders a chat completion. The conversion is the engine's
// own, read from vLLM's behaviour, so that it and the EPP's check each
// other.

// chatMsg is one converted message as vLLM's chat parsing leaves it;
// its fields are in the order a template that prints it would see them.
type chatMsg struct {
	Role             string     `json:"role"`
	Content          any        `json:"content"`
	ToolCalls        []chatCall `json:"tool_calls,omitempty"`
	Reasoning        *string    `json:"reasoning,omitempty"`
	ReasoningContent *string    `json:"reasoning_content,omitempty"`
	ToolCallID       *string    `json:"tool_call_id,omitempty"`
}

type chatCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	} `json:"function"`
}

func newCall(id, name string, args json.RawMessage) chatCall {
	c := chatCall{ID: id, Type: "function"}
	c.Function.Name = name
	c.Function.Arguments = args
	if isNull(args) {
		c.Function.Arguments = json.RawMessage(`{}`)
	}
	return c
}

type textPart struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

func (m *chatMsg) setReasoning(r string) { m.Reasoning, m.ReasoningContent = &r, &r }

// block is one Anthropic content block, with the fields the conversion reads.
type block struct {
	Type      string          `json:"type"`
	Text      string          `json:"text"`
	Source    json.RawMessage `json:"source"`
	ID        string          `json:"id"`
	ToolUseID string          `json:"tool_use_id"`
	Name      string          `json:"name"`
	Input     json.RawMessage `json:"input"`
	Content   json.RawMessage `json:"content"`
	Thinking  *string         `json:"thinking"`
}

type messagesRequest struct {
	Model     *string         `json:"model"`
	MaxTokens *int64          `json:"max_tokens"`
	System    json.RawMessage `json:"system"`
	Messages  []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
	Tools []struct {
		Name         string          `json:"name"`
		Description  *string         `json:"description"`
		InputSchema  json.RawMessage `json:"input_schema"`
		DeferLoading *bool           `json:"defer_loading"`
	} `json:"tools"`
	Stream             bool            `json:"stream"`
	ChatTemplateKwargs json.RawMessage `json:"chat_template_kwargs"`
	CacheSalt          *string         `json:"cache_salt"`
}

// billingHeader begins Claude Code's per-request attribution block, which
// vLLM's Messages endpoint drops from the system prompt.
const billingHeader = "x-anthropic-billing-header"

// parseMessages reads a Messages (or count_tokens) request as a chat.
func parseMessages(body []byte) (*genRequest, bool, error) {
	var in messagesRequest
	if err := json.Unmarshal(body, &in); err != nil {
		return nil, false, fmt.Errorf("%w: %v", errBadRequest, jsonReason(err))
	}
	if in.Model == nil || *in.Model == "" {
		return nil, false, fmt.Errorf("%w: model is required", errBadRequest)
	}
	if len(in.Messages) == 0 {
		return nil, false, fmt.Errorf("%w: messages must contain at least one item", errBadRequest)
	}
	var system []string
	systemText := func(raw json.RawMessage) error {
		if isNull(raw) {
			return nil
		}
		var s string
		if json.Unmarshal(raw, &s) == nil {
			system = append(system, s)
			return nil
		}
		var blocks []block
		if err := json.Unmarshal(raw, &blocks); err != nil {
			return fmt.Errorf("%w: system must be a string or text blocks", errBadRequest)
		}
		for _, b := range blocks {
			if b.Type == "text" && b.Text != "" && !strings.HasPrefix(b.Text, billingHeader) {
				system = append(system, b.Text)
			}
		}
		return nil
	}
	var s string
	if json.Unmarshal(in.System, &s) == nil && s == "" {
		// An empty system prompt is none.
	} else if err := systemText(in.System); err != nil {
		return nil, false, err
	}
	for _, m := range in.Messages {
		if m.Role == "system" {
			if err := systemText(m.Content); err != nil {
				return nil, false, err
			}
		}
	}
	var out []chatMsg
	if system != nil {
		out = append(out, chatMsg{Role: "system", Content: strings.Join(system, "")})
	}
	multimodal := false
	for i, m := range in.Messages {
		switch m.Role {
		case "system":
			continue
		case "user", "assistant":
		case "ctx", "msg":
			m.Role = "user" // as vLLM reads recent Claude Code's roles
		default:
			return nil, false, fmt.Errorf("%w: messages[%d].role must be user or assistant", errBadRequest, i)
		}
		msg := chatMsg{Role: m.Role}
		if json.Unmarshal(m.Content, &s) == nil {
			msg.Content = s
			out = append(out, msg)
			continue
		}
		var blocks []block
		if err := json.Unmarshal(m.Content, &blocks); err != nil || len(blocks) == 0 {
			return nil, false, fmt.Errorf("%w: messages[%d].content must be a string or content blocks", errBadRequest, i)
		}
		var parts []textPart
		var reasoning []string
		for _, b := range blocks {
			switch b.Type {
			case "text":
				if b.Text != "" {
					parts = append(parts, textPart{"text", b.Text})
				}
			case "image":
				multimodal = true
			case "thinking":
				if b.Thinking != nil {
					reasoning = append(reasoning, *b.Thinking)
				}
			case "tool_use":
				msg.ToolCalls = append(msg.ToolCalls, newCall(b.ID, b.Name, b.Input))
			case "tool_result":
				text := toolText(b.Content)
				if m.Role == "user" {
					id := b.ToolUseID
					out = append(out, chatMsg{Role: "tool", Content: text, ToolCallID: &id})
				} else {
					parts = append(parts, textPart{"text", "Tool result: " + text})
				}
			}
		}
		if reasoning != nil {
			msg.setReasoning(strings.Join(reasoning, ""))
		}
		switch {
		case len(parts) == 1:
			msg.Content = parts[0].Text
		case len(parts) > 1:
			msg.Content = parts
		}
		if m.Role == "user" && msg.Content == nil && msg.ToolCalls == nil {
			continue
		}
		if msg.Content == nil {
			msg.Content = ""
		}
		out = append(out, msg)
	}
	type function struct {
		Name         string          `json:"name"`
		Description  *string         `json:"description"`
		Parameters   json.RawMessage `json:"parameters"`
		DeferLoading *bool           `json:"defer_loading"`
	}
	type tool struct {
		Type     string   `json:"type"`
		Function function `json:"function"`
	}
	var tools []tool
	for _, t := range in.Tools {
		tools = append(tools, tool{"function", function{t.Name, t.Description, typedSchema(t.InputSchema), t.DeferLoading}})
	}
	r := &genRequest{Chat: true, Model: *in.Model, MaxTokens: -1, Stream: in.Stream}
	if in.MaxTokens != nil && *in.MaxTokens > 0 {
		r.MaxTokens = int(*in.MaxTokens)
	}
	if in.CacheSalt != nil {
		r.CacheSalt = *in.CacheSalt
	}
	c, err := chatOf(out, tools, in.ChatTemplateKwargs)
	r.Messages = c
	return r, multimodal, err
}

// toolText is a tool result's content as text: a string, or its text
// blocks joined by newlines.
func toolText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var parts []block
	_ = json.Unmarshal(raw, &parts)
	var texts []string
	for _, p := range parts {
		if p.Type == "text" || p.Type == "input_text" || p.Type == "output_text" {
			texts = append(texts, p.Text)
		}
	}
	return strings.Join(texts, "\n")
}

func chatOf(msgs []chatMsg, tools any, kwargs json.RawMessage) (*Chat, error) {
	for i := range msgs {
		if msgs[i].Content == nil {
			// vLLM's chat parsing gives every message a content.
			msgs[i].Content = ""
		}
	}
	m, err := json.Marshal(msgs)
	if err != nil {
		return nil, err
	}
	c := &Chat{Messages: m, ChatTemplateKwargs: kwargs, AddGenerationPrompt: true}
	if tools != nil {
		if c.Tools, err = json.Marshal(tools); err != nil {
			return nil, err
		}
		if string(c.Tools) == "null" {
			c.Tools = nil
		}
	}
	return c, nil
}

type responsesRequest struct {
	Model              *string           `json:"model"`
	Instructions       *string           `json:"instructions"`
	Input              json.RawMessage   `json:"input"`
	Tools              []json.RawMessage `json:"tools"`
	MaxOutputTokens    *int64            `json:"max_output_tokens"`
	PreviousResponseID *string           `json:"previous_response_id"`
	Stream             bool              `json:"stream"`
	CacheSalt          *string           `json:"cache_salt"`
}

type item struct {
	Type             string          `json:"type"`
	Role             string          `json:"role"`
	Status           string          `json:"status"`
	Content          json.RawMessage `json:"content"`
	Summary          json.RawMessage `json:"summary"`
	CallID           string          `json:"call_id"`
	Name             string          `json:"name"`
	Arguments        string          `json:"arguments"`
	Output           json.RawMessage `json:"output"`
	EncryptedContent *string         `json:"encrypted_content"`
}

// parseResponses reads a Responses request as a chat. A request that
// continues a stored response is refused: this engine stores none.
func parseResponses(body []byte) (*genRequest, bool, error) {
	var in responsesRequest
	if err := json.Unmarshal(body, &in); err != nil {
		return nil, false, fmt.Errorf("%w: %v", errBadRequest, jsonReason(err))
	}
	if in.PreviousResponseID != nil && *in.PreviousResponseID != "" {
		return nil, false, fmt.Errorf("%w: response %q not found: this engine stores no responses", errBadRequest, *in.PreviousResponseID)
	}
	var out []chatMsg
	if in.Instructions != nil && *in.Instructions != "" {
		out = append(out, chatMsg{Role: "system", Content: *in.Instructions})
	}
	cont, multimodal := false, false
	var s string
	switch {
	case json.Unmarshal(in.Input, &s) == nil:
		out = append(out, chatMsg{Role: "user", Content: s})
	default:
		var items []item
		if err := json.Unmarshal(in.Input, &items); err != nil {
			return nil, false, fmt.Errorf("%w: input must be a string or items", errBadRequest)
		}
		for i, it := range items {
			var last *chatMsg
			if n := len(out); n > 0 && out[n-1].Role == "assistant" {
				last = &out[n-1]
			}
			if i == len(items)-1 && (it.Type == "reasoning" || it.Role == "assistant") {
				cont = it.Status == "in_progress" || it.Status == "incomplete"
			}
			switch {
			case it.Type == "function_call":
				var args json.RawMessage
				if it.Arguments != "" {
					args = json.RawMessage(it.Arguments)
				}
				call := newCall(it.CallID, it.Name, args)
				if last != nil {
					last.ToolCalls = append(last.ToolCalls, call)
					continue
				}
				out = append(out, chatMsg{Role: "assistant", ToolCalls: []chatCall{call}})
			case it.Type == "function_call_output":
				id := it.CallID
				out = append(out, chatMsg{Role: "tool", Content: toolText(it.Output), ToolCallID: &id})
			case it.Type == "reasoning":
				if it.EncryptedContent != nil && *it.EncryptedContent != "" {
					return nil, false, fmt.Errorf("%w: encrypted content is not supported", errBadRequest)
				}
				r := firstPartText(it.Content)
				if r == "" {
					r = firstPartText(it.Summary)
				}
				if last != nil && last.Reasoning == nil {
					last.setReasoning(r)
					continue
				}
				m := chatMsg{Role: "assistant"}
				m.setReasoning(r)
				out = append(out, m)
			case it.Role == "assistant":
				text := firstPartText(it.Content)
				if json.Unmarshal(it.Content, &s) == nil {
					text = s
				}
				if last != nil && last.Content == nil {
					last.Content = text
					continue
				}
				out = append(out, chatMsg{Role: "assistant", Content: text})
			case it.Role != "":
				m := chatMsg{Role: it.Role, Content: ""}
				if json.Unmarshal(it.Content, &s) == nil {
					m.Content = s
				} else {
					var parts []block
					_ = json.Unmarshal(it.Content, &parts)
					var tp []textPart
					for _, p := range parts {
						switch p.Type {
						case "input_text", "text", "output_text":
							tp = append(tp, textPart{"text", p.Text})
						default:
							multimodal = true
						}
					}
					m.Content = tp
				}
				out = append(out, m)
			default:
				multimodal = true
			}
		}
	}
	if len(out) == 0 {
		return nil, false, fmt.Errorf("%w: input is required", errBadRequest)
	}
	var tools []json.RawMessage
	for _, raw := range in.Tools {
		var t map[string]json.RawMessage
		if json.Unmarshal(raw, &t) != nil || string(t["type"]) != `"function"` {
			continue
		}
		tools = append(tools, responsesTool(raw))
	}
	r := &genRequest{Chat: true, MaxTokens: -1, Stream: in.Stream}
	if in.Model != nil {
		r.Model = *in.Model
	}
	if in.MaxOutputTokens != nil && *in.MaxOutputTokens > 0 {
		r.MaxTokens = int(*in.MaxOutputTokens)
	}
	if in.CacheSalt != nil {
		r.CacheSalt = *in.CacheSalt
	}
	var toolsArg any
	if tools != nil {
		toolsArg = tools
	}
	c, err := chatOf(out, toolsArg, nil)
	if err == nil {
		c.ContinueFinalMessage, c.AddGenerationPrompt = cont, !cont
	}
	r.Messages = c
	return r, multimodal, err
}

// responsesTool is a flat Responses function tool as a chat tool: name,
// description and parameters first (null when absent), then its other
// members in their order.
func responsesTool(raw json.RawMessage) json.RawMessage {
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	var keys []string
	vals := map[string]json.RawMessage{}
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil
	}
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			return nil
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil
		}
		key, _ := k.(string)
		if _, dup := vals[key]; !dup {
			keys = append(keys, key)
		}
		vals[key] = v
	}
	var b strings.Builder
	b.WriteString(`{"type":"function","function":{`)
	first := true
	field := func(k string, v json.RawMessage) {
		if !first {
			b.WriteByte(',')
		}
		first = false
		kb, _ := json.Marshal(k)
		b.Write(kb)
		b.WriteByte(':')
		if v == nil {
			b.WriteString("null")
		} else {
			b.Write(v)
		}
	}
	for _, k := range []string{"name", "description", "parameters"} {
		field(k, vals[k])
	}
	for _, k := range keys {
		switch k {
		case "type", "name", "description", "parameters":
			continue
		}
		field(k, vals[k])
	}
	b.WriteString("}}")
	return json.RawMessage(b.String())
}

// firstPartText is the text of the first part of an array of parts.
func firstPartText(raw json.RawMessage) string {
	var parts []block
	if json.Unmarshal(raw, &parts) != nil || len(parts) == 0 {
		return ""
	}
	return parts[0].Text
}

// typedSchema is a tool's input schema as vLLM keeps it: one without a
// type gets the type object, after its other members.
func typedSchema(raw json.RawMessage) json.RawMessage {
	var m map[string]json.RawMessage
	if json.Unmarshal(raw, &m) != nil {
		return raw
	}
	if _, ok := m["type"]; ok {
		return raw
	}
	b := bytes.TrimSpace(raw)
	b = bytes.TrimSpace(b[:len(b)-1]) // without its '}'
	out := append([]byte(nil), b...)
	if len(m) > 0 {
		out = append(out, ',')
	}
	return append(out, `"type":"object"}`...)
}
