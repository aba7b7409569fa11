// Package openai reads the OpenAI-compatible requests and responses that pass
// through the request path: what a request asks for (model, prompt or token
// ids, chat messages) and what a response says it cost (token usage).
package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/kvroute/kvroute/pkg/jsonscan"
	"github.com/kvroute/kvroute/pkg/request"
)

// ErrBadRequest is wrapped by every error ParseRequest returns; the rest of
// the message says what is wrong and is meant for the client as a 400 reason.
var ErrBadRequest = errors.New("bad request")

// Paths of the APIs whose prompt is understood, matched as suffixes so that a
// gateway prefix in front of /v1 does not matter.
const (
	pathCompletions         = "/v1/completions"
	pathChatCompletions     = "/v1/chat/completions"
	pathMessages            = "/v1/messages"
	pathMessagesCountTokens = "/v1/messages/count_tokens"
	pathResponses           = "/v1/responses"
	pathGenerate            = "/inference/v1/generate"
	pathEmbeddings          = "/v1/embeddings"
)

// ParseRequest reads an OpenAI-compatible request body sent to path. For the
// completions and chat completions APIs the body must be a JSON object with
// the fields those APIs require; for any other path the model (and stream
// flag) are read when the body happens to be a JSON object, and nothing else
// is required. The caller enforces the body size limit. The returned
// request's Body is body itself, not a copy.
func ParseRequest(path string, body []byte) (*request.Request, error) {
	return ParseRequestInto(path, body, nil)
}

// ParseRequestInto is ParseRequest, reading a prompt given as one array of
// token ids into idBuf's backing array when its capacity suffices (and
// into a new one when not): the request's TokenIDs may then share idBuf's
// memory, so the caller may reuse idBuf only once nothing uses the request
// any more. All of that array, up to idBuf's capacity, is scratch to it.
// A nil idBuf is ParseRequest.
func ParseRequestInto(path string, body []byte, idBuf []uint32) (*request.Request, error) {
	return ParseRequestWith(path, body, idBuf, ParseOptions{})
}

// ParseOptions say how the model servers behind the request path read
// what a request leaves to them. The zero value is current vLLM's reading.
type ParseOptions struct {
	// KeepBillingHeader: the model servers render a Messages request's
	// system block that begins with x-anthropic-billing-header (Claude
	// Code's per-request attribution line), as vLLM did before its
	// Messages endpoint dropped that block. Off, the block is dropped
	// before rendering, as vLLM drops it.
	KeepBillingHeader bool
}

// ParseRequestWith is ParseRequestInto under o.
func ParseRequestWith(path string, body []byte, idBuf []uint32, o ParseOptions) (*request.Request, error) {
	req := &request.Request{API: apiOf(path), Body: body}
	if req.API == request.APIOther {
		parseOther(req, body)
		return req, nil
	}
	obj, err := objectFields(body, idBuf)
	if err != nil {
		return nil, err
	}
	f := &obj.fields
	if modelRequired(req.API) {
		req.Model, err = requiredString(f[fieldModel], "model")
	} else {
		req.Model, err = optionalString(f[fieldModel], "model")
	}
	if err != nil {
		return nil, err
	}
	if req.Stream, err = optionalBool(f[fieldStream], "stream", false); err != nil {
		return nil, err
	}
	if req.CacheSalt, err = optionalString(f[fieldCacheSalt], "cache_salt"); err != nil {
		return nil, err
	}
	req.MaxTokens = maxTokens(f)
	switch req.API {
	case request.APICompletions:
		err = parseCompletions(req, &obj)
	case request.APIChatCompletions:
		err = parseChat(req, f)
	case request.APIMessages, request.APIMessagesCountTokens:
		err = parseMessages(req, f, o)
	case request.APIResponses:
		err = parseResponses(req, f)
	case request.APIGenerate:
		err = parseGenerate(req, &obj)
	case request.APIEmbeddings:
		err = parseEmbeddings(req, f)
	}
	if err != nil {
		return nil, err
	}
	return req, nil
}

func apiOf(path string) request.API {
	if i := strings.IndexAny(path, "?#"); i >= 0 {
		path = path[:i]
	}
	switch {
	case strings.HasSuffix(path, pathChatCompletions):
		return request.APIChatCompletions
	case strings.HasSuffix(path, pathCompletions):
		return request.APICompletions
	case strings.HasSuffix(path, pathMessages):
		return request.APIMessages
	case strings.HasSuffix(path, pathMessagesCountTokens):
		return request.APIMessagesCountTokens
	case strings.HasSuffix(path, pathResponses):
		return request.APIResponses
	case strings.HasSuffix(path, pathGenerate):
		return request.APIGenerate
	case strings.HasSuffix(path, pathEmbeddings):
		return request.APIEmbeddings
	}
	return request.APIOther
}

// parseOther reads what it can from a request to an API whose prompt is not
// understood; such requests are routed without a prefix, so a body that is
// not JSON is not an error.
func parseOther(req *request.Request, body []byte) {
	obj, err := objectFields(body, nil)
	if err != nil {
		return
	}
	f := &obj.fields
	req.Model, _ = optionalString(f[fieldModel], "model")
	req.Stream, _ = optionalBool(f[fieldStream], "stream", false)
	req.CacheSalt, _ = optionalString(f[fieldCacheSalt], "cache_salt")
}

// objectFields checks that body is one valid JSON object and splits out the
// members that are read. Keys are matched exactly, as the model server matches them:
// encoding/json's struct decoding would also accept "Model" for "model" and
// so disagree with the server about which field counts.
func objectFields(b []byte, idBuf []uint32) (body, error) {
	trimmed := b[jsonscan.SkipSpace(b, 0):]
	if len(trimmed) == 0 {
		return body{}, fmt.Errorf("%w: the body is empty; expected a JSON object", ErrBadRequest)
	}
	if trimmed[0] != '{' {
		return body{}, fmt.Errorf("%w: the body is %s; expected a JSON object", ErrBadRequest, describe(trimmed))
	}
	obj, ok, err := splitBody(trimmed, idBuf)
	if err != nil {
		return body{}, fmt.Errorf("%w: the body is not valid JSON: %v", ErrBadRequest, err)
	}
	if !ok {
		// Decoding again is slow, but only bad requests pay for a precise reason.
		var v any
		err := json.Unmarshal(trimmed, &v)
		return body{}, fmt.Errorf("%w: the body is not valid JSON: %v", ErrBadRequest, err)
	}
	return obj, nil
}

func parseCompletions(req *request.Request, obj *body) error {
	f := &obj.fields
	var err error
	if req.AddSpecialTokens, err = optionalBool(f[fieldAddSpecialTokens], "add_special_tokens", true); err != nil {
		return err
	}
	prompt := f[fieldPrompt]
	if isAbsent(prompt) {
		// Prompts given as embeddings cannot be keyed by tokens or text.
		if !isAbsent(f[fieldPromptEmbeds]) {
			req.NoReproduciblePrefix = true
			return nil
		}
		return fmt.Errorf("%w: prompt is required", ErrBadRequest)
	}
	switch kindOf(prompt) {
	case '"':
		return unmarshalString(prompt, "prompt", &req.Prompt)
	case '[':
	default:
		return fmt.Errorf("%w: prompt is %s; expected a string, an array of strings, an array of token ids or an array of arrays of token ids",
			ErrBadRequest, describe(prompt))
	}
	switch first := firstElement(prompt); {
	case first == nil:
		return fmt.Errorf("%w: prompt is an empty array", ErrBadRequest)
	case first[0] == '"':
		// A batch of prompts: the model server runs each as its own request
		// on the chosen endpoint, and the first is the one routed by. The
		// rest are still checked, so that a 400 here matches the server's.
		prompts := jsonscan.SplitArray(prompt)
		for i, p := range prompts {
			if kindOf(p) != '"' {
				return fmt.Errorf("%w: prompt[%d] is %s; expected a string like the first element", ErrBadRequest, i, describe(p))
			}
		}
		return unmarshalString(prompts[0], "prompt[0]", &req.Prompt)
	case first[0] == '[':
		for i, l := range jsonscan.SplitArray(prompt) {
			ids, err := parseTokenIDs(l, fmt.Sprintf("prompt[%d]", i))
			if err != nil {
				return err
			}
			if i == 0 {
				req.TokenIDs = ids
			}
		}
	case obj.promptIDs != nil:
		req.TokenIDs = obj.promptIDs
	default:
		ids, err := parseTokenIDs(prompt, "prompt")
		if err != nil {
			return err
		}
		req.TokenIDs = ids
	}
	return nil
}

// parseTokenIDs reads a JSON array of token ids: integers that are not
// negative and fit in uint32, as the model server's vocabulary ids do. raw
// is already known to be valid JSON. encoding/json would take null for 0
// and accept ids beyond uint32 into wider types, so the array is read here.
func parseTokenIDs(raw json.RawMessage, name string) ([]uint32, error) {
	raw = bytes.TrimSpace(raw)
	if kindOf(raw) != '[' {
		return nil, fmt.Errorf("%w: %s is %s; expected an array of token ids", ErrBadRequest, name, describe(raw))
	}
	ids := make([]uint32, 0, bytes.Count(raw, []byte{','})+1)
	i := jsonscan.SkipSpace(raw, 1)
	if i < len(raw) && raw[i] == ']' {
		return nil, fmt.Errorf("%w: %s is an empty array of token ids", ErrBadRequest, name)
	}
	for n := 0; i < len(raw); n++ {
		start := i
		var v uint64
		for i < len(raw) && raw[i] >= '0' && raw[i] <= '9' {
			v = v*10 + uint64(raw[i]-'0')
			if v > math.MaxUint32 {
				return nil, fmt.Errorf("%w: %s[%d] is larger than a token id can be (at most %d)", ErrBadRequest, name, n, uint32(math.MaxUint32))
			}
			i++
		}
		if i == start || (i < len(raw) && (raw[i] == '.' || raw[i] == 'e' || raw[i] == 'E')) {
			return nil, fmt.Errorf("%w: %s[%d] is %s; expected a token id (an integer from 0 to %d)",
				ErrBadRequest, name, n, describe(raw[start:]), uint32(math.MaxUint32))
		}
		ids = append(ids, uint32(v))
		i = jsonscan.SkipSpace(raw, i)
		if i < len(raw) && raw[i] == ']' {
			return ids, nil
		}
		// Valid JSON has a comma here.
		i = jsonscan.SkipSpace(raw, i+1)
	}
	return nil, fmt.Errorf("%w: %s is not a complete array", ErrBadRequest, name)
}

func parseChat(req *request.Request, f *[numFields]json.RawMessage) error {
	chat := &request.Chat{}
	var err error
	if chat.AddGenerationPrompt, err = optionalBool(f[fieldAddGenerationPrompt], "add_generation_prompt", true); err != nil {
		return err
	}
	if chat.ContinueFinalMessage, err = optionalBool(f[fieldContinueFinalMessage], "continue_final_message", false); err != nil {
		return err
	}
	if chat.AddSpecialTokens, err = optionalBool(f[fieldAddSpecialTokens], "add_special_tokens", false); err != nil {
		return err
	}
	if chat.ChatTemplate, err = optionalString(f[fieldChatTemplate], "chat_template"); err != nil {
		return err
	}
	if chat.ChatTemplateKwargs, err = optionalRaw(f[fieldChatTemplateKwargs], "chat_template_kwargs", '{', "an object"); err != nil {
		return err
	}
	if chat.Tools, err = optionalRaw(f[fieldTools], "tools", '[', "an array"); err != nil {
		return err
	}
	messages := f[fieldMessages]
	if isAbsent(messages) {
		return fmt.Errorf("%w: messages is required", ErrBadRequest)
	}
	if kindOf(messages) != '[' {
		return fmt.Errorf("%w: messages is %s; expected an array of message objects", ErrBadRequest, describe(messages))
	}
	list := jsonscan.SplitArray(messages)
	if len(list) == 0 {
		return fmt.Errorf("%w: messages is an empty array", ErrBadRequest)
	}
	chat.Messages = messages
	return setChat(req, chat, list)
}

// setChat makes chat, whose messages are list, req's, with the text form
// of its messages that approximate matching reads.
func setChat(req *request.Request, chat *request.Chat, list []json.RawMessage) error {
	var prompt strings.Builder
	if chat.Tools != nil {
		prompt.WriteString("<tools>\n")
		writeCompact(&prompt, chat.Tools)
		prompt.WriteString("\n")
	}
	for i, m := range list {
		multimodal, err := renderMessage(&prompt, m, i)
		if err != nil {
			return err
		}
		req.NoReproduciblePrefix = req.NoReproduciblePrefix || multimodal
	}
	req.Chat = chat
	req.AddSpecialTokens = chat.AddSpecialTokens
	req.Prompt = prompt.String()
	return nil
}

// renderMessage checks one chat message and appends a deterministic text
// form of it to b. The form is not the model's chat template, which only the
// model server knows; it only has to give the same text for the same
// conversation prefix. It reports whether the message has non-text content.
func renderMessage(b *strings.Builder, raw json.RawMessage, i int) (multimodal bool, err error) {
	if kindOf(raw) != '{' {
		return false, fmt.Errorf("%w: messages[%d] is %s; expected an object", ErrBadRequest, i, describe(raw))
	}
	m, err := jsonscan.SplitObject(raw)
	if err != nil {
		return false, fmt.Errorf("%w: messages[%d]: %v", ErrBadRequest, i, err)
	}
	if isAbsent(m["role"]) {
		return false, fmt.Errorf("%w: messages[%d].role is required", ErrBadRequest, i)
	}
	var role string
	if err := unmarshalString(m["role"], fmt.Sprintf("messages[%d].role", i), &role); err != nil {
		return false, err
	}
	b.WriteString("<")
	b.WriteString(role)
	if name, err := optionalString(m["name"], "name"); err == nil && name != "" {
		b.WriteString(" ")
		b.WriteString(name)
	}
	b.WriteString(">\n")
	content := m["content"]
	switch kindOf(content) {
	case 0, 'n':
	case '"':
		var s string
		if err := unmarshalString(content, fmt.Sprintf("messages[%d].content", i), &s); err != nil {
			return false, err
		}
		b.WriteString(s)
	case '[':
		for j, p := range jsonscan.SplitArray(content) {
			text, isText, err := contentPart(p)
			if err != nil {
				return false, fmt.Errorf("%w: messages[%d].content[%d] %v", ErrBadRequest, i, j, err)
			}
			if !isText {
				multimodal = true
			}
			b.WriteString(text)
		}
	default:
		return false, fmt.Errorf("%w: messages[%d].content is %s; expected a string, null or an array of content parts",
			ErrBadRequest, i, describe(content))
	}
	if calls := m["tool_calls"]; !isAbsent(calls) {
		b.WriteString("\n<tool_calls>")
		writeCompact(b, calls)
	}
	b.WriteString("\n")
	return multimodal, nil
}

// contentPart reads one part of a message's content. A part without a type
// is classified by its keys, as the model server does for such parts. The
// text of a non-text part is a placeholder naming its type.
func contentPart(raw json.RawMessage) (text string, isText bool, err error) {
	if kindOf(raw) != '{' {
		return "", false, fmt.Errorf("is %s; expected an object", describe(raw))
	}
	p, err := jsonscan.SplitObject(raw)
	if err != nil {
		return "", false, err
	}
	typ, err := optionalString(p["type"], "type")
	if err != nil {
		return "", false, errors.New("has a type that is not a string")
	}
	if typ == "" {
		if _, ok := p["text"]; ok && len(p) == 1 {
			typ = "text"
		}
	}
	if typ != "text" {
		if typ == "" {
			typ = "untyped"
		}
		return "<" + typ + ">", false, nil
	}
	if kindOf(p["text"]) != '"' {
		return "", false, fmt.Errorf("is a text part whose text is %s; expected a string", describe(p["text"]))
	}
	text, err = jsonscan.DecodeString(p["text"])
	return text, err == nil, err
}

func writeCompact(b *strings.Builder, raw json.RawMessage) {
	var buf bytes.Buffer
	if err := json.Compact(&buf, raw); err != nil {
		b.Write(raw)
		return
	}
	b.Write(buf.Bytes())
}

// isAbsent reports whether a member is missing or null, which the model
// server treats alike.
func isAbsent(raw json.RawMessage) bool {
	k := kindOf(raw)
	return k == 0 || k == 'n'
}

// kindOf returns the first byte of a JSON value, which says its type, or 0
// for a missing value.
func kindOf(raw []byte) byte {
	if i := jsonscan.SkipSpace(raw, 0); i < len(raw) {
		return raw[i]
	}
	return 0
}

// describe names the type of a JSON value for error messages.
func describe(raw []byte) string {
	switch k := kindOf(raw); {
	case k == 0:
		return "missing"
	case k == '"':
		return "a string"
	case k == '{':
		return "an object"
	case k == '[':
		return "an array"
	// A letter only starts a literal if the literal follows: a body of
	// text ("no healthy upstream") is not null.
	case k == 't' && bytes.HasPrefix(trimmedValue(raw), []byte("true")), k == 'f' && bytes.HasPrefix(trimmedValue(raw), []byte("false")):
		return "a boolean"
	case k == 'n' && bytes.HasPrefix(trimmedValue(raw), []byte("null")):
		return "null"
	case k == '-':
		return "a negative number"
	case k >= '0' && k <= '9':
		return "a number"
	}
	return "not valid JSON"
}

// trimmedValue is raw without its leading whitespace.
func trimmedValue(raw []byte) []byte { return raw[jsonscan.SkipSpace(raw, 0):] }

// firstElement returns the start of a JSON array's first element, or nil
// when the array is empty.
func firstElement(array []byte) []byte {
	array = array[jsonscan.SkipSpace(array, 0):]
	i := jsonscan.SkipSpace(array, 1)
	if i >= len(array) || array[i] == ']' {
		return nil
	}
	return array[i:]
}

// maxTokens is the output length the request asks for at most, 0 when it
// does not say. It is a hint for latency prediction, not a field the EPP
// validates: a value that is not a non-negative integer reads as 0 and is
// left for the model server to refuse.
func maxTokens(f *[numFields]json.RawMessage) int {
	for _, raw := range []json.RawMessage{f[fieldMaxCompletionTokens], f[fieldMaxTokens], f[fieldMaxOutputTokens], samplingMaxTokens(f[fieldSamplingParams])} {
		// What encoding/json reads into an int: an integer literal within
		// int64's range (raw is valid JSON, so without a '+' or leading
		// zeros, which ParseInt would also take).
		if n, err := strconv.ParseInt(string(raw), 10, 64); err == nil && n >= 0 {
			return int(n)
		}
	}
	return 0
}

func requiredString(raw json.RawMessage, name string) (string, error) {
	if isAbsent(raw) {
		return "", fmt.Errorf("%w: %s is required", ErrBadRequest, name)
	}
	var s string
	if err := unmarshalString(raw, name, &s); err != nil {
		return "", err
	}
	if s == "" {
		return "", fmt.Errorf("%w: %s is an empty string", ErrBadRequest, name)
	}
	return s, nil
}

func optionalString(raw json.RawMessage, name string) (string, error) {
	if isAbsent(raw) {
		return "", nil
	}
	var s string
	err := unmarshalString(raw, name, &s)
	return s, err
}

func unmarshalString(raw json.RawMessage, name string, s *string) error {
	if kindOf(raw) != '"' {
		return fmt.Errorf("%w: %s is %s; expected a string", ErrBadRequest, name, describe(raw))
	}
	v, err := jsonscan.DecodeString(raw)
	if err != nil {
		return fmt.Errorf("%w: %s: %v", ErrBadRequest, name, err)
	}
	*s = v
	return nil
}

func optionalBool(raw json.RawMessage, name string, def bool) (bool, error) {
	raw = bytes.TrimSpace(raw)
	switch {
	case isAbsent(raw):
		return def, nil
	case bytes.Equal(raw, []byte("true")):
		return true, nil
	case bytes.Equal(raw, []byte("false")):
		return false, nil
	}
	return false, fmt.Errorf("%w: %s is %s; expected a boolean", ErrBadRequest, name, describe(raw))
}

// optionalRaw returns a member of JSON kind want unchanged, or nil when it
// is missing or null.
func optionalRaw(raw json.RawMessage, name string, want byte, wantName string) (json.RawMessage, error) {
	if isAbsent(raw) {
		return nil, nil
	}
	if kindOf(raw) != want {
		return nil, fmt.Errorf("%w: %s is %s; expected %s", ErrBadRequest, name, describe(raw), wantName)
	}
	return raw, nil
}
