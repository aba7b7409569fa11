package sim

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// ErrStreamRead marks a stream that broke off (the connection, or the
// reader's deadline), as opposed to one the server got wrong.
var ErrStreamRead = errors.New("read stream")

// ErrBadStream marks a stream that does not follow the OpenAI SSE shape.
var ErrBadStream = errors.New("malformed completion stream")

// StreamResult is what a streamed completion returned.
type StreamResult struct {
	Text string
	// Usage, from the final usage chunk, when the stream had one.
	HasUsage                                     bool
	PromptTokens, CachedTokens, CompletionTokens int
}

// ReadStream reads an OpenAI-style completion or chat stream (SSE) up to
// "data: [DONE]", calling firstToken when the first generated text
// arrives. An error chunk, a malformed chunk, or a stream without [DONE]
// is an error.
func ReadStream(body io.Reader, firstToken func()) (StreamResult, error) {
	var res StreamResult
	var text bytes.Buffer
	seen := false
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		data, ok := bytes.CutPrefix(sc.Bytes(), []byte("data: "))
		if !ok {
			continue
		}
		if string(data) == "[DONE]" {
			res.Text = text.String()
			return res, nil
		}
		var chunk struct {
			Choices []struct {
				Text  string `json:"text"`
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
			Usage *struct {
				PromptTokens        int `json:"prompt_tokens"`
				CompletionTokens    int `json:"completion_tokens"`
				PromptTokensDetails *struct {
					CachedTokens int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
			Error *struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal(data, &chunk); err != nil {
			return StreamResult{}, fmt.Errorf("%w: chunk: %w", ErrBadStream, err)
		}
		if chunk.Error != nil {
			return StreamResult{}, fmt.Errorf("%w: error chunk: %s", ErrBadStream, chunk.Error.Message)
		}
		for _, c := range chunk.Choices {
			t := c.Text + c.Delta.Content
			if t != "" && !seen {
				seen = true
				if firstToken != nil {
					firstToken()
				}
			}
			text.WriteString(t)
		}
		if u := chunk.Usage; u != nil {
			res.HasUsage = true
			res.PromptTokens, res.CompletionTokens = u.PromptTokens, u.CompletionTokens
			if u.PromptTokensDetails != nil {
				res.CachedTokens = u.PromptTokensDetails.CachedTokens
			}
		}
	}
	if err := sc.Err(); err != nil {
		return StreamResult{}, fmt.Errorf("%w: %w", ErrStreamRead, err)
	}
	return StreamResult{}, fmt.Errorf("%w: no [DONE]", ErrBadStream)
}
