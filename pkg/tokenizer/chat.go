package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"
	"unicode"

	"github.com/ardanlabs/jinja"

	"github.com/kvroute/kvroute/pkg/jsonscan"
	"github.com/kvroute/kvroute/pkg/request"
)

// chatTemplate renders chat messages into the prompt text a model server
// tokenizes for a chat completion.
type chatTemplate struct {
	tmpl *jinja.Template
	// special are the special-token strings a template may refer to
	// (bos_token, eos_token, ...), as tokenizer_config.json names them.
	special map[string]string
	// joinParts says the template takes content as a string: text parts
	// of a message are joined with newlines before rendering, as the model
	// server does for such templates. Templates that iterate over content
	// get the parts as they are.
	joinParts bool
}

// parseChatConfig reads the chat template and special tokens of a
// tokenizer_config.json; a config without a template gives nil.
func parseChatConfig(data []byte) (*chatTemplate, error) {
	var cfg map[string]json.RawMessage
	if err := json.Unmarshal(data, &cfg); err != nil {
		return nil, fmt.Errorf("%w: tokenizer config: %w", ErrBadFile, err)
	}
	source, err := templateSource(cfg["chat_template"])
	if err != nil || source == "" {
		return nil, err
	}
	return newChatTemplate(source, cfg)
}

func newChatTemplate(source string, cfg map[string]json.RawMessage) (*chatTemplate, error) {
	tmpl, err := jinja.Compile(source)
	if err != nil {
		return nil, fmt.Errorf("%w: compile: %w", ErrTemplate, err)
	}
	c := &chatTemplate{tmpl: tmpl, special: map[string]string{}, joinParts: !iteratesContent(source)}
	for _, name := range []string{"bos_token", "eos_token", "pad_token", "unk_token", "sep_token", "cls_token", "mask_token"} {
		c.special[name] = tokenContent(cfg[name])
	}
	return c, nil
}

// templateSource picks the default template: chat_template is either a
// string or a list of named templates.
func templateSource(raw json.RawMessage) (string, error) {
	if isNull(raw) {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var named []struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	if err := json.Unmarshal(raw, &named); err != nil {
		return "", fmt.Errorf("%w: chat_template: %w", ErrBadFile, err)
	}
	for _, n := range named {
		if n.Name == "default" {
			return n.Template, nil
		}
	}
	return "", nil
}

// tokenContent reads a special token given as a string or as an added-token
// object with a content field.
func tokenContent(raw json.RawMessage) string {
	if isNull(raw) {
		return ""
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var obj struct {
		Content string `json:"content"`
	}
	_ = json.Unmarshal(raw, &obj)
	return obj.Content
}

// iteratesContent tells whether a template loops over a message's content
// (the "openai" content format) rather than printing it as a string.
func iteratesContent(source string) bool {
	return contentLoop.MatchString(source)
}

var contentLoop = regexp.MustCompile(`\{%-?\s*for\s+\w+\s+in\s+(message\[['"]content['"]\]|message\.content|content)\b`)

// HasChatTemplate reports whether the tokenizer can render chat requests.
func (t *Tokenizer) HasChatTemplate() bool { return t.chat != nil }

// RenderChat renders a chat request's messages with the model's template,
// with the variables the model server passes: the messages (text parts
// joined, tool-call arguments decoded from JSON), tools,
// add_generation_prompt, the special tokens and chat_template_kwargs. A
// request that brings its own template is not rendered locally
// (ErrUnsupported).
func (t *Tokenizer) RenderChat(c *request.Chat) (string, error) {
	if t.chat == nil {
		return "", fmt.Errorf("%w: the tokenizer has no chat template", ErrTemplate)
	}
	if c == nil {
		return "", fmt.Errorf("%w: no chat", ErrTemplate)
	}
	if c.ChatTemplate != "" {
		return "", fmt.Errorf("%w: chat template given by the request", ErrUnsupported)
	}
	if c.ContinueFinalMessage && c.AddGenerationPrompt {
		return "", fmt.Errorf("%w: continue_final_message and add_generation_prompt together", ErrTemplate)
	}
	messages, err := decodeJSONValue(c.Messages)
	if err != nil {
		return "", fmt.Errorf("%w: messages: %w", ErrTemplate, err)
	}
	if !messages.IsList() || messages.AsList().Len() == 0 {
		return "", fmt.Errorf("%w: messages must be a non-empty list", ErrTemplate)
	}
	final, err := t.chat.conversation(messages)
	if err != nil {
		return "", err
	}
	vars := make(map[string]jinja.Value, 16)
	if len(bytes.TrimSpace(c.ChatTemplateKwargs)) > 0 {
		kw, err := decodeJSONValue(c.ChatTemplateKwargs)
		if err != nil {
			return "", fmt.Errorf("%w: chat_template_kwargs: %w", ErrTemplate, err)
		}
		if kw.IsDict() {
			d := kw.AsDict()
			for _, k := range d.Keys {
				vars[k] = d.Data[k]
			}
		}
	}
	for k, v := range t.chat.special {
		vars[k] = jinja.NewString(v)
	}
	vars["messages"] = messages
	vars["add_generation_prompt"] = jinja.NewBool(c.AddGenerationPrompt)
	if !isNull(c.Tools) {
		tools, err := decodeJSONValue(c.Tools)
		if err != nil {
			return "", fmt.Errorf("%w: tools: %w", ErrTemplate, err)
		}
		vars["tools"] = tools
	}
	text, err := render(t.chat.tmpl, vars)
	if err != nil {
		return "", fmt.Errorf("%w: render: %w", ErrTemplate, err)
	}
	if c.ContinueFinalMessage {
		return cutAfterFinal(text, final)
	}
	return text, nil
}

// EncodeChat renders a chat request and tokenizes the text, adding special
// tokens only when the request asks for them: the template writes them.
func (t *Tokenizer) EncodeChat(c *request.Chat) ([]uint32, error) {
	text, err := t.RenderChat(c)
	if err != nil {
		if errors.Is(err, ErrTemplate) {
			t.metrics().rejected.WithLabelValues(t.name, "template").Inc()
		}
		return nil, err
	}
	return t.Encode(text, c.AddSpecialTokens)
}

// conversation rewrites the messages in place the way the model server
// does before rendering, and returns the final message's text content.
func (ct *chatTemplate) conversation(messages jinja.Value) (string, error) {
	var final string
	for i, m := range messages.AsList().Items {
		if !m.IsDict() {
			return "", fmt.Errorf("%w: message %d is not an object", ErrTemplate, i)
		}
		d := m.AsDict()
		content, _ := d.Get("content")
		switch {
		case content.IsString():
			final = content.AsString()
		case content.IsList():
			text, err := joinTextParts(content)
			if err != nil {
				return "", fmt.Errorf("message %d: %w", i, err)
			}
			final = text
			if ct.joinParts {
				d.Set("content", jinja.NewString(text))
			}
		default:
			final = ""
		}
		if calls, ok := d.Get("tool_calls"); ok && calls.IsList() {
			for _, call := range calls.AsList().Items {
				decodeArguments(call)
			}
		}
	}
	return final, nil
}

// joinTextParts joins the text parts of a content list with newlines; any
// other part (an image) makes the request one that cannot be tokenized
// from text alone.
func joinTextParts(content jinja.Value) (string, error) {
	var parts []string
	for _, p := range content.AsList().Items {
		if !p.IsDict() {
			return "", fmt.Errorf("%w: content part is not an object", ErrTemplate)
		}
		typ, _ := p.AsDict().Get("type")
		if !typ.IsString() || typ.AsString() != "text" {
			return "", fmt.Errorf("%w: content part of type %v", ErrUnsupported, typ)
		}
		text, _ := p.AsDict().Get("text")
		if !text.IsString() {
			return "", fmt.Errorf("%w: text part without a string", ErrTemplate)
		}
		parts = append(parts, text.AsString())
	}
	return strings.Join(parts, "\n"), nil
}

// decodeArguments replaces a tool call's JSON-string arguments with the
// object they encode, as templates expect to print them with tojson.
func decodeArguments(call jinja.Value) {
	if !call.IsDict() {
		return
	}
	fn, ok := call.AsDict().Get("function")
	if !ok || !fn.IsDict() {
		return
	}
	args, ok := fn.AsDict().Get("arguments")
	if !ok || !args.IsString() {
		return
	}
	if v, err := decodeJSONValue([]byte(args.AsString())); err == nil && v.IsDict() {
		fn.AsDict().Set("arguments", v)
	}
}

// cutAfterFinal ends the rendered text right after the final message's
// content, so that the model continues that message rather than starting a
// new one. Spacing around the content is kept when the template kept it.
func cutAfterFinal(text, final string) (string, error) {
	stripped := strings.TrimFunc(final, isPySpace)
	at := strings.LastIndex(text, stripped)
	if stripped == "" || at < 0 {
		return "", fmt.Errorf("%w: the final message is not in the rendered chat", ErrTemplate)
	}
	left := strings.TrimLeftFunc(final, isPySpace)
	if end := at + len(left); end <= len(text) && text[at:end] == final {
		return text[:end], nil
	}
	return text[:at+len(stripped)], nil
}

// isPySpace is the whitespace a Python str.strip() removes.
func isPySpace(r rune) bool {
	return unicode.IsSpace(r) || (r >= 0x1c && r <= 0x1f)
}

// decodeJSONValue decodes JSON into template values, keeping object keys in
// their order, because tojson prints them in that order and the ids depend
// on it.
func decodeJSONValue(data []byte) (jinja.Value, error) {
	if jsonscan.Valid(data) {
		v, _, err := decodeValid(data, jsonscan.SkipSpace(data, 0), 0)
		return v, err
	}
	// Invalid: encoding/json says what is wrong.
	return decodeJSONStream(data)
}

// decodeValid decodes the value at b[i] of valid JSON, returning the index
// just past it. encoding/json's token stream costs a function call per byte
// and a copy per token, which for a chat's long system prompt was most of
// rendering it.
func decodeValid(b []byte, i, depth int) (jinja.Value, int, error) {
	if depth > maxJSONDepth {
		return jinja.Undefined(), i, errors.New("JSON nested too deeply")
	}
	next := func(j int) int {
		j = jsonscan.SkipSpace(b, j)
		if b[j] == ',' {
			j = jsonscan.SkipSpace(b, j+1)
		}
		return j
	}
	end := jsonscan.SkipValue(b, i)
	switch b[i] {
	case '"':
		s, err := jsonscan.DecodeString(b[i:end])
		return jinja.NewString(s), end, err
	case 't', 'f':
		return jinja.NewBool(b[i] == 't'), end, nil
	case 'n':
		return jinja.None(), end, nil
	case '[':
		var items []jinja.Value
		j := jsonscan.SkipSpace(b, i+1)
		for b[j] != ']' {
			item, after, err := decodeValid(b, j, depth+1)
			if err != nil {
				return jinja.Undefined(), j, err
			}
			items = append(items, item)
			j = next(after)
		}
		return jinja.NewList(items), j + 1, nil
	case '{':
		d := jinja.NewDict()
		j := jsonscan.SkipSpace(b, i+1)
		for b[j] != '}' {
			keyEnd := jsonscan.SkipValue(b, j)
			key, err := jsonscan.DecodeString(b[j:keyEnd])
			if err != nil {
				return jinja.Undefined(), j, err
			}
			val, after, err := decodeValid(b, jsonscan.SkipSpace(b, jsonscan.SkipSpace(b, keyEnd)+1), depth+1)
			if err != nil {
				return jinja.Undefined(), j, err
			}
			d.AsDict().Set(key, val)
			j = next(after)
		}
		return d, j + 1, nil
	}
	return jinja.FromGoValue(json.Number(b[i:end])), end, nil
}

// decodeJSONStream is decodeJSONValue through encoding/json's token stream.
func decodeJSONStream(data []byte) (jinja.Value, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	v, err := decodeValue(dec, 0)
	if err != nil {
		return jinja.Undefined(), err
	}
	if _, err := dec.Token(); err != io.EOF {
		return jinja.Undefined(), errors.New("trailing data after JSON value")
	}
	return v, nil
}

// maxJSONDepth bounds nesting, so hostile input cannot exhaust the stack.
const maxJSONDepth = 64

func decodeValue(dec *json.Decoder, depth int) (jinja.Value, error) {
	if depth > maxJSONDepth {
		return jinja.Undefined(), errors.New("JSON nested too deeply")
	}
	tok, err := dec.Token()
	if err != nil {
		return jinja.Undefined(), err
	}
	switch v := tok.(type) {
	case json.Delim:
		switch v {
		case '[':
			var items []jinja.Value
			for dec.More() {
				item, err := decodeValue(dec, depth+1)
				if err != nil {
					return jinja.Undefined(), err
				}
				items = append(items, item)
			}
			_, err := dec.Token()
			return jinja.NewList(items), err
		case '{':
			d := jinja.NewDict()
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return jinja.Undefined(), err
				}
				key, _ := kt.(string)
				val, err := decodeValue(dec, depth+1)
				if err != nil {
					return jinja.Undefined(), err
				}
				d.AsDict().Set(key, val)
			}
			_, err := dec.Token()
			return d, err
		}
		return jinja.Undefined(), fmt.Errorf("unexpected %v", v)
	case string:
		return jinja.NewString(v), nil
	case bool:
		return jinja.NewBool(v), nil
	case nil:
		return jinja.None(), nil
	case json.Number:
		return jinja.FromGoValue(v), nil
	}
	return jinja.Undefined(), fmt.Errorf("unexpected JSON token %v", tok)
}

// render runs the template engine, turning a panic inside it into an
// error: the messages come from the network, and a template engine's
// corner cases must not take the EPP down.
func render(tmpl *jinja.Template, vars map[string]jinja.Value) (text string, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("template engine failed: %v", r)
		}
	}()
	return tmpl.RenderValues(vars)
}
