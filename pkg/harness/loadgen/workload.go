// Package loadgen drives a simulated vLLM fleet with open-loop traffic
// (Poisson arrivals) through a routing policy, measures what each request
// saw (time to first token, end-to-end latency, cached tokens), and
// compares policies: client-side baselines and an oracle that reads the
// engines' true caches, against kvroute's EPP replicas asked over ext_proc
// by the gateway every request passes (pkg/harness/gateway), or through
// the EPP's standalone proxy. It writes the results as Markdown tables and
// SVG plots.
package loadgen

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"
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
	// KindPD: the P/D mix. A ShortShare of conversations is one short
	// prompt of ShortTokens that shares nothing; the rest are multi-turn
	// chats opening with one of the Groups' long system prompts, whose
	// later turns find their history where the earlier ones were decoded.
	KindPD Kind = "pd-mix"
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
	// SLO is every request's TTFT objective, sent as x-slo-ttft-ms and
	// what SLO attainment is judged by (zero: none). Classes, when set,
	// give each conversation one of several instead.
	SLO     time.Duration
	Classes []Class
	// ShortShare and ShortTokens shape KindPD's short prompts.
	ShortShare  float64
	ShortTokens int
	// Tenants, when set, give each conversation a tenant by share, named
	// as its flow (x-gateway-inference-fairness-id).
	Tenants []Tenant
}

// meanTurns is the mean number of requests a conversation of w makes.
func (w Workload) meanTurns() float64 {
	turns := float64(max(w.Turns, 1))
	switch w.Kind {
	case KindMultiTurn:
		return turns
	case KindPD:
		return w.ShortShare + (1-w.ShortShare)*turns
	}
	return 1
}

// Class is a kind of traffic in a mixed workload: the InferenceObjective
// its requests name (x-gateway-inference-objective) with its priority
// (below zero: sheddable), and its TTFT SLO.
type Class struct {
	Objective string
	Priority  int
	SLO       time.Duration
	// Share is the class's share of conversations.
	Share float64
}

// Conversation is a unit of arrival: one request, or a chat's turns sent
// one after another.
type Conversation struct {
	Chat   bool
	System string
	// Users are the user messages (completions: the single prompt).
	Users []string
	// Objective and SLO are the conversation's class's (or the workload's
	// SLO, with no objective).
	Objective string
	SLO       time.Duration
	// Tenant is the conversation's flow (empty: none named).
	Tenant string
}

// headers are the request headers a conversation's requests carry.
func (c Conversation) headers() map[string]string {
	h := map[string]string{}
	if c.Objective != "" {
		h["x-gateway-inference-objective"] = c.Objective
	}
	if c.Tenant != "" {
		h[headerFairnessID] = c.Tenant
	}
	if c.SLO > 0 {
		h["x-slo-ttft-ms"] = strconv.FormatFloat(float64(c.SLO)/float64(time.Millisecond), 'f', -1, 64)
	}
	return h
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
	var c Conversation
	switch g.w.Kind {
	case KindMultiTurn:
		c = Conversation{Chat: true, System: g.systems[g.rng.IntN(len(g.systems))]}
		for range g.w.Turns {
			c.Users = append(c.Users, g.words(g.w.QuestionTokens))
		}
	case KindUnrelated:
		c = Conversation{Users: []string{g.words(g.w.SystemTokens + g.w.QuestionTokens)}}
	case KindPD:
		if g.rng.Float64() < g.w.ShortShare {
			c = Conversation{Users: []string{g.words(g.w.ShortTokens)}}
			break
		}
		c = Conversation{Chat: true, System: g.systems[g.rng.IntN(len(g.systems))]}
		for range g.w.Turns {
			c.Users = append(c.Users, g.words(g.w.QuestionTokens))
		}
	default:
		sys := g.systems[g.rng.IntN(len(g.systems))]
		c = Conversation{Users: []string{sys + " " + g.words(g.w.QuestionTokens)}}
	}
	c.SLO = g.w.SLO
	if len(g.w.Classes) > 0 {
		cl := g.class()
		c.Objective, c.SLO = cl.Objective, cl.SLO
	}
	if len(g.w.Tenants) > 0 {
		c.Tenant = g.tenant()
	}
	return c
}

// class draws a class by share.
func (g *generator) class() Class {
	total := 0.0
	for _, cl := range g.w.Classes {
		total += cl.Share
	}
	x := g.rng.Float64() * total
	for _, cl := range g.w.Classes {
		if x < cl.Share {
			return cl
		}
		x -= cl.Share
	}
	return g.w.Classes[len(g.w.Classes)-1]
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
