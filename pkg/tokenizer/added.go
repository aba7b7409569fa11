package tokenizer

import (
	"sort"
	"strings"
	"unicode"
	"unicode/utf8"
)

// addedToken is a token matched in the text before anything else, as the
// reference's added vocabulary does: special tokens such as <|im_start|>,
// and any other token the tokenizer.json lists as added.
type addedToken struct {
	ID         uint32 `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
	Special    bool   `json:"special"`
}

// addedMatcher finds added tokens leftmost-longest, as an Aho-Corasick
// automaton in that mode would, with a byte trie: added vocabularies are
// small and share prefixes such as "<|".
type addedMatcher struct {
	nodes []trieNode
	// first marks the bytes an added token can start with, so that text
	// without them is skipped at memchr speed.
	first     [256]bool
	firstOnly int // the one first byte when there is exactly one, else -1
	tokens    []addedToken
}

type trieNode struct {
	// children, sorted by byte.
	keys  []byte
	child []int32
	// token is the index in tokens of the token ending here, or -1.
	token int32
}

func newAddedMatcher(tokens []addedToken) *addedMatcher {
	if len(tokens) == 0 {
		return nil
	}
	m := &addedMatcher{nodes: []trieNode{{token: -1}}, tokens: tokens, firstOnly: -1}
	firsts := 0
	for ti, t := range tokens {
		if t.Content == "" {
			continue
		}
		if !m.first[t.Content[0]] {
			firsts++
			m.firstOnly = int(t.Content[0])
		}
		m.first[t.Content[0]] = true
		n := int32(0)
		for i := 0; i < len(t.Content); i++ {
			n = m.childOrNew(n, t.Content[i])
		}
		m.nodes[n].token = int32(ti)
	}
	if firsts != 1 {
		m.firstOnly = -1
	}
	return m
}

func (m *addedMatcher) childOrNew(n int32, b byte) int32 {
	nd := &m.nodes[n]
	i := sort.Search(len(nd.keys), func(i int) bool { return nd.keys[i] >= b })
	if i < len(nd.keys) && nd.keys[i] == b {
		return nd.child[i]
	}
	m.nodes = append(m.nodes, trieNode{token: -1})
	c := int32(len(m.nodes) - 1)
	nd = &m.nodes[n]
	nd.keys = append(nd.keys, 0)
	nd.child = append(nd.child, 0)
	copy(nd.keys[i+1:], nd.keys[i:])
	copy(nd.child[i+1:], nd.child[i:])
	nd.keys[i], nd.child[i] = b, c
	return c
}

func (m *addedMatcher) child(n int32, b byte) int32 {
	nd := &m.nodes[n]
	for i, k := range nd.keys {
		if k == b {
			return nd.child[i]
		}
		if k > b {
			break
		}
	}
	return -1
}

// longestAt returns the longest token that s[i:] starts with.
func (m *addedMatcher) longestAt(s string, i int) (tok int32, end int) {
	tok, n := -1, int32(0)
	for j := i; j < len(s); j++ {
		if n = m.child(n, s[j]); n < 0 {
			break
		}
		if t := m.nodes[n].token; t >= 0 {
			tok, end = t, j+1
		}
	}
	return tok, end
}

// piece is a span of text that is either an added token or plain text.
type piece struct {
	start, end int
	token      int32 // index into the matcher's tokens, or -1 for text
}

// split appends the pieces of s: matched added tokens (with the whitespace
// their lstrip/rstrip flags swallow) and the text between them.
func (m *addedMatcher) split(s string, dst []piece) []piece {
	if m == nil {
		return append(dst, piece{0, len(s), -1})
	}
	textStart := 0
	for i := 0; i < len(s); {
		// Jump to the next byte that can start a token.
		if m.firstOnly >= 0 {
			k := strings.IndexByte(s[i:], byte(m.firstOnly))
			if k < 0 {
				break
			}
			i += k
		} else if !m.first[s[i]] {
			i++
			continue
		}
		tok, end := m.longestAt(s, i)
		if tok < 0 {
			i++
			continue
		}
		t := &m.tokens[tok]
		start := i
		if t.SingleWord && (isWordRuneBefore(s, start) || isWordRuneAt(s, end)) {
			i = end
			continue
		}
		if t.LStrip {
			for start > textStart {
				r, n := utf8.DecodeLastRuneInString(s[textStart:start])
				if !unicode.IsSpace(r) {
					break
				}
				start -= n
			}
		}
		if t.RStrip {
			for end < len(s) {
				r, n := utf8.DecodeRuneInString(s[end:])
				if !unicode.IsSpace(r) {
					break
				}
				end += n
			}
		}
		if start > textStart {
			dst = append(dst, piece{textStart, start, -1})
		}
		dst = append(dst, piece{start, end, tok})
		textStart, i = end, end
	}
	if textStart < len(s) {
		dst = append(dst, piece{textStart, len(s), -1})
	}
	return dst
}

func isWordRune(r rune) bool { return r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) }

func isWordRuneBefore(s string, i int) bool {
	if i == 0 {
		return false
	}
	r, _ := utf8.DecodeLastRuneInString(s[:i])
	return isWordRune(r)
}

func isWordRuneAt(s string, i int) bool {
	if i >= len(s) {
		return false
	}
	r, _ := utf8.DecodeRuneInString(s[i:])
	return isWordRune(r)
}
