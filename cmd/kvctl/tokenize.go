package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/tokenizer"
)

func init() {
	commands["tokenize"] = command{
		summary: "tokenize a prompt or chat messages with a local tokenizer and print the token ids as JSON",
		run: func(args []string) error {
			return tokenizeCmd(args, os.Stdin, os.Stdout, os.Stderr)
		},
	}
}

// maxPromptBytes bounds what tokenize reads from stdin.
const maxPromptBytes = 64 << 20

// chatInput is the chat form on stdin: a chat completion request body, or
// just its messages array.
type chatInput struct {
	Messages             json.RawMessage `json:"messages"`
	Tools                json.RawMessage `json:"tools"`
	AddGenerationPrompt  *bool           `json:"add_generation_prompt"`
	ContinueFinalMessage bool            `json:"continue_final_message"`
	AddSpecialTokens     bool            `json:"add_special_tokens"`
	ChatTemplateKwargs   json.RawMessage `json:"chat_template_kwargs"`
}

// tokenizeCmd tokenizes --prompt or stdin and writes {"ids":[...],"count":n}
// (and the rendered text, for chat).
func tokenizeCmd(args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("tokenize", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("tokenizer", "", "tokenizer `directory` (tokenizer.json, tokenizer_config.json) or tokenizer.json file")
	prompt := fs.String("prompt", "", "the `text` to tokenize; without it, stdin")
	chat := fs.Bool("chat", false, "the input is chat messages as JSON (a messages array or a chat request body), rendered with the chat template")
	special := fs.Bool("add-special-tokens", false, "add the post-processor's special tokens (BOS) to a prompt, as completions do by default")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), "Usage: kvctl tokenize --tokenizer DIR [--prompt TEXT | --chat] [< input]\n\n"+
			"Prints the token ids a model server computes for the prompt, as JSON.\n\n")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *dir == "" {
		fs.Usage()
		return fmt.Errorf("%w: --tokenizer is required", errUsage)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	tok, err := tokenizer.Load(*dir, tokenizer.Options{})
	if err != nil {
		return err
	}
	input := []byte(*prompt)
	promptSet := false
	fs.Visit(func(f *flag.Flag) { promptSet = promptSet || f.Name == "prompt" })
	if !promptSet {
		if input, err = io.ReadAll(io.LimitReader(stdin, maxPromptBytes+1)); err != nil {
			return fmt.Errorf("read stdin: %w", err)
		}
		if len(input) > maxPromptBytes {
			return fmt.Errorf("input over %d bytes", maxPromptBytes)
		}
	}
	out := struct {
		IDs      []uint32 `json:"ids"`
		Count    int      `json:"count"`
		Rendered string   `json:"rendered,omitempty"`
	}{}
	if *chat {
		c, err := parseChatInput(input)
		if err != nil {
			return err
		}
		if out.Rendered, err = tok.RenderChat(c); err != nil {
			return err
		}
		out.IDs, err = tok.EncodeChat(c)
		if err != nil {
			return err
		}
	} else if out.IDs, err = tok.Encode(string(input), *special); err != nil {
		return err
	}
	if out.IDs == nil {
		out.IDs = []uint32{}
	}
	out.Count = len(out.IDs)
	enc := json.NewEncoder(stdout)
	enc.SetEscapeHTML(false)
	return enc.Encode(out)
}

// parseChatInput accepts a messages array or a chat request body; a body
// without add_generation_prompt gets it on, as the chat endpoint does.
func parseChatInput(data []byte) (*request.Chat, error) {
	data = bytes.TrimSpace(data)
	if len(data) > 0 && data[0] == '[' {
		return &request.Chat{Messages: data, AddGenerationPrompt: true}, nil
	}
	var in chatInput
	if err := json.Unmarshal(data, &in); err != nil {
		return nil, fmt.Errorf("chat input: %w", err)
	}
	if len(in.Messages) == 0 {
		return nil, errors.New("chat input has no messages")
	}
	addGen := in.AddGenerationPrompt == nil || *in.AddGenerationPrompt
	return &request.Chat{
		Messages: in.Messages, Tools: in.Tools, ChatTemplateKwargs: in.ChatTemplateKwargs,
		AddGenerationPrompt: addGen, ContinueFinalMessage: in.ContinueFinalMessage, AddSpecialTokens: in.AddSpecialTokens,
	}, nil
}
