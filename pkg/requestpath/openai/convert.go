package openai

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute/pkg/jsonscan"
	"github.com/kvroute/kvroute/pkg/request"
)

// vLLM serves Anthropic's Messages and OpenAI's Responses APIs by turning
// each request into the chat messages it then renders with the model's
// chat template, as it renders a chat completion. The request path makes
// the same messages, so that the chat template (in process, or the model
// server's /tokenize) renders the very prompt the engine caches. The
// messages are written as vLLM's chat parsing leaves them (content always
// present, reasoning also under reasoning_content), which parsing them
// again leaves unchanged.

// chatMessage is one converted message; nil fields are absent.
type chatMessage struct {
	role string
	// content is a JSON string or an array of content parts.
	content    json.RawMessage
	toolCalls  []json.RawMessage
	reasoning  *string
	toolCallID *string
}

// appendJSON writes the messages as the JSON array a chat request carries.
func appendJSON(b []byte, msgs []*chatMessage) []byte {
	b = append(b, '[')
	for i, m := range msgs {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"role":`...)
		b = appendString(b, m.role)
		b = append(b, `,"content":`...)
		if m.content == nil {
			b = append(b, `""`...)
		} else {
			b = append(b, m.content...)
		}
		if m.toolCalls != nil {
			b = append(b, `,"tool_calls":[`...)
			for j, c := range m.toolCalls {
				if j > 0 {
					b = append(b, ',')
				}
				b = append(b, c...)
			}
			b = append(b, ']')
		}
		if m.reasoning != nil {
			b = append(b, `,"reasoning":`...)
			b = appendString(b, *m.reasoning)
			b = append(b, `,"reasoning_content":`...)
			b = appendString(b, *m.reasoning)
		}
		if m.toolCallID != nil {
			b = append(b, `,"tool_call_id":`...)
			b = appendString(b, *m.toolCallID)
		}
		b = append(b, '}')
	}
	return append(b, ']')
}

func appendString(b []byte, s string) []byte {
	q, err := json.Marshal(s)
	if err != nil {
		// A Go string always marshals (invalid UTF-8 becomes U+FFFD).
		return append(b, `""`...)
	}
	return append(b, q...)
}

func jsonString(s string) json.RawMessage { return appendString(nil, s) }

// toolCall is a chat tool call; arguments is the JSON value the chat
// template prints (vLLM decodes a call's JSON-string arguments before
// rendering, and takes empty ones for {}).
func toolCall(id, name string, arguments json.RawMessage) json.RawMessage {
	b := []byte(`{"id":`)
	b = appendString(b, id)
	b = append(b, `,"type":"function","function":{"name":`...)
	b = appendString(b, name)
	b = append(b, `,"arguments":`...)
	if isAbsent(arguments) {
		b = append(b, `{}`...)
	} else {
		b = append(b, arguments...)
	}
	return append(b, `}}`...)
}

// functionTool is a chat tool as vLLM's chat tool model dumps it: name,
// description and parameters always present (null when not given), then
// any further members in their order.
func functionTool(name string, description, parameters json.RawMessage, extra [][2]json.RawMessage) json.RawMessage {
	b := []byte(`{"type":"function","function":{"name":`)
	b = appendString(b, name)
	for _, m := range [][2]json.RawMessage{{json.RawMessage(`"description"`), description}, {json.RawMessage(`"parameters"`), parameters}} {
		b = append(b, ',')
		b = append(b, m[0]...)
		b = append(b, ':')
		b = appendRawOrNull(b, m[1])
	}
	for _, m := range extra {
		b = append(b, ',')
		b = append(b, m[0]...)
		b = append(b, ':')
		b = appendRawOrNull(b, m[1])
	}
	return append(b, `}}`...)
}

func appendRawOrNull(b []byte, raw json.RawMessage) []byte {
	if kindOf(raw) == 0 {
		return append(b, "null"...)
	}
	return append(b, raw...)
}

// member is one member of an object, its key decoded.
type member struct {
	key string
	raw json.RawMessage
}

// members splits a JSON object (known to be valid) into its members in
// order, which tools' extra fields keep.
func members(raw json.RawMessage) ([]member, error) {
	raw = raw[jsonscan.SkipSpace(raw, 0):]
	var out []member
	i := jsonscan.SkipSpace(raw, 1)
	for i < len(raw) && raw[i] != '}' {
		end := jsonscan.SkipValue(raw, i)
		key, err := jsonscan.DecodeString(raw[i:end])
		if err != nil {
			return nil, err
		}
		i = jsonscan.SkipSpace(raw, jsonscan.SkipSpace(raw, end)+1)
		vend := jsonscan.SkipValue(raw, i)
		out = append(out, member{key, raw[i:vend:vend]})
		i = jsonscan.SkipSpace(raw, vend)
		if i < len(raw) && raw[i] == ',' {
			i = jsonscan.SkipSpace(raw, i+1)
		}
	}
	return out, nil
}

// object reads raw as a JSON object, named name in errors.
func object(raw json.RawMessage, name string) (map[string]json.RawMessage, error) {
	if kindOf(raw) != '{' {
		return nil, fmt.Errorf("%w: %s is %s; expected an object", ErrBadRequest, name, describe(raw))
	}
	m, err := jsonscan.SplitObject(raw)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrBadRequest, name, err)
	}
	return m, nil
}

// array reads raw as a JSON array, named name in errors.
func array(raw json.RawMessage, name string) ([]json.RawMessage, error) {
	if kindOf(raw) != '[' {
		return nil, fmt.Errorf("%w: %s is %s; expected an array", ErrBadRequest, name, describe(raw))
	}
	return jsonscan.SplitArray(raw), nil
}

// stringOr is raw as a string when it is one, else def.
func stringOr(raw json.RawMessage, def string) string {
	if kindOf(raw) != '"' {
		return def
	}
	s, err := jsonscan.DecodeString(raw)
	if err != nil {
		return def
	}
	return s
}

// chatOf is the chat request a converted request renders as.
func chatOf(req *request.Request, msgs []*chatMessage, tools []json.RawMessage, kwargs json.RawMessage) error {
	if len(msgs) == 0 {
		return fmt.Errorf("%w: the request has no messages to render", ErrBadRequest)
	}
	chat := &request.Chat{AddGenerationPrompt: true, ChatTemplateKwargs: kwargs}
	size := 256
	for _, m := range msgs {
		size += len(m.content) + 64
		for _, c := range m.toolCalls {
			size += len(c)
		}
	}
	chat.Messages = appendJSON(make([]byte, 0, size), msgs)
	if tools != nil {
		b := []byte{'['}
		for i, t := range tools {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, t...)
		}
		chat.Tools = append(b, ']')
	}
	return setChat(req, chat, jsonscan.SplitArray(chat.Messages))
}

// samplingMaxTokens is generate's sampling_params.max_tokens, raw.
func samplingMaxTokens(raw json.RawMessage) json.RawMessage {
	if kindOf(raw) != '{' {
		return nil
	}
	m, err := jsonscan.SplitObject(raw)
	if err != nil {
		return nil
	}
	return m["max_tokens"]
}

// modelRequired: vLLM's generate, embeddings and Responses requests may
// leave the model to the server's default.
func modelRequired(api request.API) bool {
	switch api {
	case request.APIGenerate, request.APIEmbeddings, request.APIResponses:
		return false
	}
	return true
}

// parseGenerate reads vLLM's /inference/v1/generate request: token ids in,
// taken as given.
func parseGenerate(req *request.Request, obj *body) error {
	raw := obj.fields[fieldTokenIDs]
	if isAbsent(raw) {
		return fmt.Errorf("%w: token_ids is required", ErrBadRequest)
	}
	if obj.tokenIDs != nil {
		req.TokenIDs = obj.tokenIDs
		return nil
	}
	ids, err := parseTokenIDs(raw, "token_ids")
	if err != nil {
		return err
	}
	req.TokenIDs = ids
	return nil
}

// parseEmbeddings reads an /v1/embeddings request's input as vLLM
// tokenizes it: a string (or the first of a batch of them) with special
// tokens unless add_special_tokens is false, or token ids as given. Where
// the engine caches embedding prompts (a causal model pooling its last
// token, vLLM's default then), its KV events put them in the index; where
// it does not, they match nothing there and load decides.
func parseEmbeddings(req *request.Request, f *[numFields]json.RawMessage) error {
	var err error
	if req.AddSpecialTokens, err = optionalBool(f[fieldAddSpecialTokens], "add_special_tokens", true); err != nil {
		return err
	}
	input := f[fieldInput]
	if isAbsent(input) {
		if !isAbsent(f[fieldMessages]) {
			// Chat-shaped embeddings: routed by load.
			return nil
		}
		return fmt.Errorf("%w: input is required", ErrBadRequest)
	}
	switch kindOf(input) {
	case '"':
		return unmarshalString(input, "input", &req.Prompt)
	case '[':
	default:
		return fmt.Errorf("%w: input is %s; expected a string, an array of strings or an array of token ids", ErrBadRequest, describe(input))
	}
	first := firstElement(input)
	switch {
	case first == nil:
		return fmt.Errorf("%w: input is an empty array", ErrBadRequest)
	case first[0] == '"':
		return unmarshalString(jsonscan.SplitArray(input)[0], "input[0]", &req.Prompt)
	case first[0] == '[':
		ids, err := parseTokenIDs(jsonscan.SplitArray(input)[0], "input[0]")
		req.TokenIDs = ids
		return err
	}
	ids, err := parseTokenIDs(input, "input")
	req.TokenIDs = ids
	return err
}

// BillingHeaderPrefix begins Claude Code's attribution line, whose
// per-request hash would end every prefix cache hit at the system prompt.
const BillingHeaderPrefix = "x-anthropic-billing-header"

// parseMessages converts an Anthropic Messages (or count_tokens) request
// into the chat request vLLM's Messages endpoint renders.
func parseMessages(req *request.Request, f *[numFields]json.RawMessage, o ParseOptions) error {
	rawMsgs := f[fieldMessages]
	if isAbsent(rawMsgs) {
		return fmt.Errorf("%w: messages is required", ErrBadRequest)
	}
	list, err := array(rawMsgs, "messages")
	if err != nil {
		return err
	}
	if len(list) == 0 {
		return fmt.Errorf("%w: messages must contain at least one item", ErrBadRequest)
	}
	kwargs, err := optionalRaw(f[fieldChatTemplateKwargs], "chat_template_kwargs", '{', "an object")
	if err != nil {
		return err
	}
	type anthMsg struct {
		role    string
		content json.RawMessage
	}
	in := make([]anthMsg, len(list))
	for i, raw := range list {
		m, err := object(raw, fmt.Sprintf("messages[%d]", i))
		if err != nil {
			return err
		}
		if err := unmarshalString(m["role"], fmt.Sprintf("messages[%d].role", i), &in[i].role); err != nil {
			return err
		}
		switch in[i].role {
		case "user", "assistant", "system":
		case "ctx", "msg":
			// Roles recent Claude Code versions send, which vLLM reads
			// as the user's.
			in[i].role = "user"
		default:
			return fmt.Errorf("%w: messages[%d].role is %q; expected user, assistant or system", ErrBadRequest, i, in[i].role)
		}
		in[i].content = m["content"]
		switch kindOf(in[i].content) {
		case '"':
		case '[':
			if len(jsonscan.SplitArray(in[i].content)) == 0 {
				return fmt.Errorf("%w: messages[%d].content must not be empty", ErrBadRequest, i)
			}
		default:
			return fmt.Errorf("%w: messages[%d].content is %s; expected a string or an array of content blocks", ErrBadRequest, i, describe(in[i].content))
		}
	}

	// The system prompt: the system field, then any system messages,
	// their texts joined with nothing between them.
	var system []string
	sysBlocks := func(raw json.RawMessage, name string) error {
		blocks, err := array(raw, name)
		if err != nil {
			return err
		}
		for j, bl := range blocks {
			b, err := object(bl, fmt.Sprintf("%s[%d]", name, j))
			if err != nil {
				return err
			}
			if stringOr(b["type"], "") != "text" {
				continue
			}
			text := stringOr(b["text"], "")
			if text == "" || (!o.KeepBillingHeader && strings.HasPrefix(text, BillingHeaderPrefix)) {
				continue
			}
			system = append(system, text)
		}
		return nil
	}
	switch sys := f[fieldSystem]; kindOf(sys) {
	case 0, 'n':
	case '"':
		if s := stringOr(sys, ""); s != "" {
			system = append(system, s)
		}
	case '[':
		if err := sysBlocks(sys, "system"); err != nil {
			return err
		}
	default:
		return fmt.Errorf("%w: system is %s; expected a string or an array of text blocks", ErrBadRequest, describe(sys))
	}
	for i, m := range in {
		if m.role != "system" {
			continue
		}
		if kindOf(m.content) == '"' {
			system = append(system, stringOr(m.content, ""))
		} else if err := sysBlocks(m.content, fmt.Sprintf("messages[%d].content", i)); err != nil {
			return err
		}
	}
	var out []*chatMessage
	if system != nil {
		out = append(out, &chatMessage{role: "system", content: jsonString(strings.Join(system, ""))})
	}

	for i, m := range in {
		if m.role == "system" {
			continue
		}
		msg := &chatMessage{role: m.role}
		if kindOf(m.content) == '"' {
			msg.content = m.content
			out = append(out, msg)
			continue
		}
		// parts are content parts; a text part is held as its text, a
		// JSON string, until the message's content is made.
		type part struct {
			raw  json.RawMessage
			text bool
		}
		var parts []part
		var reasoning []string
		textOnly := true
		for j, bl := range jsonscan.SplitArray(m.content) {
			var b blockFields
			if err := b.read(bl); err != nil {
				return fmt.Errorf("%w: messages[%d].content[%d]: %v", ErrBadRequest, i, j, err)
			}
			switch stringOr(b[bType], "") {
			case "text":
				// The text is kept as the body wrote it: decoding and
				// encoding it again would double what a request costs.
				if t := bytes.TrimSpace(b[bText]); kindOf(t) == '"' && len(t) > 2 {
					parts = append(parts, part{t, true})
				}
			case "image":
				if !isAbsent(b[bSource]) {
					parts = append(parts, part{json.RawMessage(`{"type":"image_url"}`), false})
					textOnly = false
				}
			case "thinking":
				if !isAbsent(b[bThinking]) {
					reasoning = append(reasoning, stringOr(b[bThinking], ""))
				}
			case "tool_use":
				id := stringOr(b[bID], "")
				if id == "" {
					id = "call_" + strconv.FormatInt(nowUnix(), 10)
				}
				msg.toolCalls = append(msg.toolCalls, toolCall(id, stringOr(b[bName], ""), b[bInput]))
			case "tool_result":
				if m.role == "user" {
					tool, multimodal, err := userToolResult(&b, fmt.Sprintf("messages[%d].content[%d]", i, j))
					if err != nil {
						return err
					}
					req.NoReproduciblePrefix = req.NoReproduciblePrefix || multimodal
					out = append(out, tool)
					continue
				}
				// An assistant's tool result is text; a structured one
				// would be Python's repr of it, which is not reproduced.
				c := b[bContent]
				switch kindOf(c) {
				case '"', 0, 'n':
					parts = append(parts, part{jsonString("Tool result: " + stringOr(c, "")), true})
				default:
					req.NoReproduciblePrefix = true
				}
			}
		}
		if reasoning != nil {
			r := strings.Join(reasoning, "")
			msg.reasoning = &r
		}
		switch {
		case len(parts) == 1 && parts[0].text:
			msg.content = parts[0].raw
		case len(parts) > 0:
			b := []byte{'['}
			for k, p := range parts {
				if k > 0 {
					b = append(b, ',')
				}
				if p.text {
					b = append(b, rawTextPart(p.raw)...)
				} else {
					b = append(b, p.raw...)
				}
			}
			msg.content = append(b, ']')
		}
		req.NoReproduciblePrefix = req.NoReproduciblePrefix || !textOnly
		if m.role == "user" && msg.content == nil && msg.toolCalls == nil && msg.reasoning == nil {
			continue
		}
		out = append(out, msg)
	}

	var tools []json.RawMessage
	if raw := f[fieldTools]; !isAbsent(raw) {
		list, err := array(raw, "tools")
		if err != nil {
			return err
		}
		tools = make([]json.RawMessage, 0, len(list))
		for i, t := range list {
			m, err := object(t, fmt.Sprintf("tools[%d]", i))
			if err != nil {
				return err
			}
			var name string
			if err := unmarshalString(m["name"], fmt.Sprintf("tools[%d].name", i), &name); err != nil {
				return err
			}
			schema := m["input_schema"]
			if kindOf(schema) != '{' {
				return fmt.Errorf("%w: tools[%d].input_schema is %s; expected an object", ErrBadRequest, i, describe(schema))
			}
			if s, err := jsonscan.SplitObject(schema); err == nil {
				if _, typed := s["type"]; !typed {
					// vLLM gives a schema without a type the type object,
					// after its other members.
					schema = withMember(schema, `"type"`, `"object"`)
				}
			}
			tools = append(tools, functionTool(name, m["description"], schema,
				[][2]json.RawMessage{{json.RawMessage(`"defer_loading"`), m["defer_loading"]}}))
		}
	}
	return chatOf(req, out, tools, kwargs)
}

// nowUnix names a tool call that came without an id, as vLLM names it.
var nowUnix = func() int64 { return time.Now().Unix() }

// withMember is the object obj with the member key: value added last.
func withMember(obj json.RawMessage, key, value string) json.RawMessage {
	end := len(obj) - 1
	for end > 0 && obj[end] != '}' {
		end--
	}
	b := append([]byte(nil), obj[:end]...)
	if ms, _ := members(obj); len(ms) > 0 {
		b = append(b, ',')
	}
	b = append(b, key...)
	b = append(b, ':')
	b = append(b, value...)
	return append(b, '}')
}

// rawTextPart is a text part whose text is raw, a JSON string.
func rawTextPart(raw json.RawMessage) json.RawMessage {
	b := make([]byte, 0, len(raw)+len(`{"type":"text","text":}`))
	b = append(b, `{"type":"text","text":`...)
	b = append(b, raw...)
	return append(b, '}')
}

func textPart(text string) json.RawMessage {
	b := []byte(`{"type":"text","text":`)
	b = appendString(b, text)
	return append(b, '}')
}

// userToolResult is the tool message a user's tool_result block becomes:
// its text, or its text blocks joined by newlines. An image in it makes the
// request's prefix one that text cannot key (multimodal).
func userToolResult(b *blockFields, name string) (*chatMessage, bool, error) {
	id := stringOr(b[bToolUseID], "")
	msg := &chatMessage{role: "tool", toolCallID: &id}
	multimodal := false
	c := b[bContent]
	switch kindOf(c) {
	case '"':
		msg.content = c
	case '[':
		var texts []string
		for k, it := range jsonscan.SplitArray(c) {
			if kindOf(it) != '{' {
				continue
			}
			item, err := object(it, fmt.Sprintf("%s.content[%d]", name, k))
			if err != nil {
				return nil, false, err
			}
			switch stringOr(item["type"], "") {
			case "text":
				texts = append(texts, stringOr(item["text"], ""))
			case "image", "tool_reference":
				multimodal = true
			}
		}
		msg.content = jsonString(strings.Join(texts, "\n"))
	}
	return msg, multimodal, nil
}

// parseResponses converts an OpenAI Responses request into the chat
// request vLLM's Responses implementation renders. A request that
// continues a stored response (previous_response_id) is rendered by the
// engine after that response's messages, which only the engine has: its
// prefix is matched approximately.
func parseResponses(req *request.Request, f *[numFields]json.RawMessage) error {
	prev, err := optionalString(f[fieldPreviousResponseID], "previous_response_id")
	if err != nil {
		return err
	}
	instructions, err := optionalString(f[fieldInstructions], "instructions")
	if err != nil {
		return err
	}
	var out []*chatMessage
	if instructions != "" {
		out = append(out, &chatMessage{role: "system", content: jsonString(instructions)})
	}
	input := f[fieldInput]
	continueFinal := false
	switch kindOf(input) {
	case '"':
		out = append(out, &chatMessage{role: "user", content: input})
	case '[':
		items := jsonscan.SplitArray(input)
		for i, it := range items {
			name := fmt.Sprintf("input[%d]", i)
			item, err := object(it, name)
			if err != nil {
				return err
			}
			var last *chatMessage
			if len(out) > 0 && out[len(out)-1].role == "assistant" {
				last = out[len(out)-1]
			}
			typ := stringOr(item["type"], "")
			role := stringOr(item["role"], "")
			if i == len(items)-1 && (typ == "reasoning" || (typ == "message" || typ == "") && role == "assistant") {
				s := stringOr(item["status"], "")
				continueFinal = s == "in_progress" || s == "incomplete"
			}
			switch {
			case typ == "function_call":
				tc := toolCall(stringOr(item["call_id"], ""), stringOr(item["name"], ""), decodedArguments(item["arguments"]))
				if last != nil {
					last.toolCalls = append(last.toolCalls, tc)
					continue
				}
				out = append(out, &chatMessage{role: "assistant", toolCalls: []json.RawMessage{tc}})
			case typ == "function_call_output":
				id := stringOr(item["call_id"], "")
				out = append(out, &chatMessage{role: "tool", toolCallID: &id, content: toolOutput(item["output"])})
			case typ == "reasoning":
				if enc := item["encrypted_content"]; kindOf(enc) == '"' && stringOr(enc, "") != "" {
					return fmt.Errorf("%w: %s: encrypted reasoning content is not supported", ErrBadRequest, name)
				}
				text := firstText(item["content"])
				if kindOf(item["content"]) != '[' || len(jsonscan.SplitArray(item["content"])) == 0 {
					text = firstText(item["summary"])
				}
				if last != nil && last.reasoning == nil {
					last.reasoning = &text
					continue
				}
				out = append(out, &chatMessage{role: "assistant", reasoning: &text})
			case role == "assistant" && (typ == "message" || typ == ""):
				text := firstTextRaw(item["content"])
				if last != nil && last.content == nil {
					last.content = text
					continue
				}
				out = append(out, &chatMessage{role: "assistant", content: text})
			case role != "" && (typ == "message" || typ == ""):
				msg, multimodal, err := inputMessage(role, item["content"], name)
				if err != nil {
					return err
				}
				req.NoReproduciblePrefix = req.NoReproduciblePrefix || multimodal
				out = append(out, msg)
			default:
				// Items the engine runs itself (tool searches, built-in
				// tools): their rendering is not reproduced.
				req.NoReproduciblePrefix = true
			}
		}
	case 0, 'n':
		return fmt.Errorf("%w: input is required", ErrBadRequest)
	default:
		return fmt.Errorf("%w: input is %s; expected a string or an array of items", ErrBadRequest, describe(input))
	}

	var tools []json.RawMessage
	if raw := f[fieldTools]; !isAbsent(raw) {
		list, err := array(raw, "tools")
		if err != nil {
			return err
		}
		for i, t := range list {
			m, err := object(t, fmt.Sprintf("tools[%d]", i))
			if err != nil {
				return err
			}
			if stringOr(m["type"], "") != "function" {
				continue
			}
			ms, err := members(t)
			if err != nil {
				return fmt.Errorf("%w: tools[%d]: %v", ErrBadRequest, i, err)
			}
			var extra [][2]json.RawMessage
			for _, mb := range ms {
				switch mb.key {
				case "type", "name", "description", "parameters":
					continue
				}
				extra = append(extra, [2]json.RawMessage{jsonString(mb.key), mb.raw})
			}
			tools = append(tools, functionTool(stringOr(m["name"], ""), m["description"], m["parameters"], extra))
		}
		if len(tools) == 0 {
			tools = nil
		}
	}
	if err := chatOf(req, out, tools, nil); err != nil {
		return err
	}
	req.Chat.ContinueFinalMessage = continueFinal
	req.Chat.AddGenerationPrompt = !continueFinal
	if prev != "" {
		req.InexactPrefix = "previous_response_id"
	}
	return nil
}

// decodedArguments is a function call's JSON-string arguments as the
// value they encode (empty: none); arguments that are not JSON are left a
// string, which the engine refuses.
func decodedArguments(raw json.RawMessage) json.RawMessage {
	s := stringOr(raw, "")
	if s == "" {
		return nil
	}
	if v := []byte(s); jsonscan.Valid(v) {
		return v
	}
	return raw
}

// toolOutput is a function call's output as the tool message's text: a
// string, or its text parts joined by newlines.
func toolOutput(raw json.RawMessage) json.RawMessage {
	if kindOf(raw) != '[' {
		return jsonString(stringOr(raw, ""))
	}
	var texts []string
	for _, p := range jsonscan.SplitArray(raw) {
		if kindOf(p) != '{' {
			continue
		}
		m, err := jsonscan.SplitObject(p)
		if err != nil {
			continue
		}
		switch stringOr(m["type"], "") {
		case "input_text", "output_text", "text":
			texts = append(texts, stringOr(m["text"], ""))
		}
	}
	return jsonString(strings.Join(texts, "\n"))
}

// firstTextRaw is an assistant item's text as a JSON string: its content
// when a string, else its first part's text (kept as the body wrote it).
func firstTextRaw(content json.RawMessage) json.RawMessage {
	switch kindOf(content) {
	case '"':
		return bytes.TrimSpace(content)
	case '[':
		parts := jsonscan.SplitArray(content)
		if len(parts) > 0 && kindOf(parts[0]) == '{' {
			if m, err := jsonscan.SplitObject(parts[0]); err == nil && kindOf(m["text"]) == '"' {
				return bytes.TrimSpace(m["text"])
			}
		}
		if len(parts) > 0 && kindOf(parts[0]) == '"' {
			return bytes.TrimSpace(parts[0])
		}
	}
	return json.RawMessage(`""`)
}

// firstText is the text of an array's first part (a reasoning item's
// content or summary, an assistant message's content): vLLM reads that
// one only.
func firstText(raw json.RawMessage) string {
	if kindOf(raw) != '[' {
		return ""
	}
	parts := jsonscan.SplitArray(raw)
	if len(parts) == 0 {
		return ""
	}
	if kindOf(parts[0]) == '"' {
		return stringOr(parts[0], "")
	}
	m, err := jsonscan.SplitObject(parts[0])
	if err != nil {
		return ""
	}
	return stringOr(m["text"], "")
}

// inputMessage is a user, system or developer input item as a chat
// message: its text parts (input_text) as text parts, which the chat
// template's content format then joins or keeps.
func inputMessage(role string, content json.RawMessage, name string) (*chatMessage, bool, error) {
	msg := &chatMessage{role: role}
	switch kindOf(content) {
	case '"':
		msg.content = content
		return msg, false, nil
	case 0, 'n':
		return msg, false, nil
	case '[':
	default:
		return nil, false, fmt.Errorf("%w: %s.content is %s; expected a string or an array of content parts", ErrBadRequest, name, describe(content))
	}
	b := []byte{'['}
	multimodal := false
	n := 0
	for k, p := range jsonscan.SplitArray(content) {
		m, err := object(p, fmt.Sprintf("%s.content[%d]", name, k))
		if err != nil {
			return nil, false, err
		}
		switch stringOr(m["type"], "") {
		case "input_text", "text", "output_text":
			if n > 0 {
				b = append(b, ',')
			}
			if t := bytes.TrimSpace(m["text"]); kindOf(t) == '"' {
				b = append(b, rawTextPart(t)...)
			} else {
				b = append(b, textPart("")...)
			}
			n++
		default:
			multimodal = true
		}
	}
	msg.content = append(b, ']')
	return msg, multimodal, nil
}

// blockFields are the members of an Anthropic content block the
// conversion reads, found without a map: a request's blocks are most of
// its body, and a map each would cost about as much again.
type blockFields [numBlockFields]json.RawMessage

const (
	bType = iota
	bText
	bSource
	bThinking
	bID
	bName
	bInput
	bContent
	bToolUseID
	numBlockFields
)

var blockFieldNames = [numBlockFields]string{"type", "text", "source", "thinking", "id", "name", "input", "content", "tool_use_id"}

// read fills b from raw, a JSON object (the body is already valid); a key
// given twice keeps its last value, as with encoding/json.
func (b *blockFields) read(raw json.RawMessage) error {
	raw = raw[jsonscan.SkipSpace(raw, 0):]
	if kindOf(raw) != '{' {
		return fmt.Errorf("is %s; expected an object", describe(raw))
	}
	i := jsonscan.SkipSpace(raw, 1)
	for i < len(raw) && raw[i] == '"' {
		end := jsonscan.SkipValue(raw, i)
		key := raw[i+1 : end-1]
		if bytes.IndexByte(key, '\\') >= 0 {
			k, err := jsonscan.DecodeString(raw[i:end])
			if err != nil {
				return err
			}
			key = []byte(k)
		}
		i = jsonscan.SkipSpace(raw, jsonscan.SkipSpace(raw, end)+1)
		vend := jsonscan.SkipValue(raw, i)
		for f, name := range blockFieldNames {
			if string(key) == name {
				b[f] = raw[i:vend:vend]
			}
		}
		i = jsonscan.SkipSpace(raw, vend)
		if i < len(raw) && raw[i] == ',' {
			i = jsonscan.SkipSpace(raw, i+1)
		}
	}
	return nil
}
