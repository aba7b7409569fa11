// Package loadgen drives a simulated vLLM fleet with open-loop traffic
// (Poisson arrivals) through a routing policy, measures what each request
// saw (time to first token, end-to-end latency, cached tokens), and
// compares policies: client-side baselines and an oracle that reads the
// engines' true caches, against kvroute's EPP serving real HTTP through its
// standalone proxy. It writes the results as Markdown tables and SVG plots.
package loadgen

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
)

// Kind is a workload's shape.
type Kind string

// The workload kinds.
const (
	// KindSharedPrefix: groups of prompts sharing a system prompt, each
	// with a question of its own (completions API).
	KindSharedPrefix Kind = "shared-prefix"
	// KindMultiTurn: chat conversations whose every turn resends the
	// history (chat completions API).
	KindMultiTurn Kind = "multi-turn"
	// KindUnrelated: prompts that share nothing.
	KindUnrelated Kind = "unrelated"
)

// Workload describes the traffic. Lengths are in tokens of the simulated
// tokenizer, one per word.
type Workload struct {
	Name string
	Kind Kind
	// Groups of SystemTokens-long system prompts; a request picks a group
	// uniformly. Unrelated prompts are SystemTokens+QuestionTokens long.
	Groups         int
	SystemTokens   int
	QuestionTokens int
	// Turns per conversation (multi-turn), each adding QuestionTokens of
	// user text and the reply.
	Turns int
	// OutputTokens per request.
	OutputTokens int
	// Vocab bounds the words drawn (default 20000).
	Vocab int
}

// Conversation is a unit of arrival: one request, or a chat's turns sent
// one after another.
type Conversation struct {
	Chat   bool
	System string
	// Users are the user messages (completions: the single prompt).
	Users []string
}

// generator draws conversations for a workload.
type generator struct {
	w       Workload
	rng     *rand.Rand
	systems []string
}

func newGenerator(w Workload, seed uint64) *generator {
	if w.Vocab <= 0 {
		w.Vocab = 20000
	}
	if w.Groups <= 0 {
		w.Groups = 1
	}
	if w.Turns <= 0 {
		w.Turns = 1
	}
	g := &generator{w: w, rng: rand.New(rand.NewPCG(seed, seed^0x6c6f6164))}
	for range w.Groups {
		g.systems = append(g.systems, g.words(w.SystemTokens))
	}
	return g
}

func (g *generator) words(n int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteByte('w')
		b.WriteString(strconv.Itoa(g.rng.IntN(g.w.Vocab)))
	}
	return b.String()
}

func (g *generator) next() Conversation {
	switch g.w.Kind {
	case KindMultiTurn:
		c := Conversation{Chat: true, System: g.systems[g.rng.IntN(len(g.systems))]}
		for range g.w.Turns {
			c.Users = append(c.Users, g.words(g.w.QuestionTokens))
		}
		return c
	case KindUnrelated:
		return Conversation{Users: []string{g.words(g.w.SystemTokens + g.w.QuestionTokens)}}
	default:
		sys := g.systems[g.rng.IntN(len(g.systems))]
		return Conversation{Users: []string{sys + " " + g.words(g.w.QuestionTokens)}}
	}
}

// message is a chat message.
type message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// body builds the request for turn i given the replies so far, and the
// API path it goes to.
func (c Conversation) body(model string, i int, replies []string, maxTokens int) (path string, body []byte, err error) {
	req := map[string]any{
		"model": model, "max_tokens": maxTokens, "stream": true,
		"stream_options": map[string]any{"include_usage": true},
	}
	if !c.Chat {
		req["prompt"] = c.Users[i]
		path = "/v1/completions"
	} else {
		msgs := []message{{Role: "system", Content: c.System}}
		for j := 0; j < i; j++ {
			msgs = append(msgs, message{"user", c.Users[j]}, message{"assistant", replies[j]})
		}
		msgs = append(msgs, message{"user", c.Users[i]})
		req["messages"] = msgs
		path = "/v1/chat/completions"
	}
	body, err = json.Marshal(req)
	if err != nil {
		return "", nil, fmt.Errorf("loadgen: encode request: %w", err)
	}
	return path, body, nil
}
