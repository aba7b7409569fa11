package tokenizer

import (
	"errors"
	"fmt"
	"sync/atomic"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
)

// Errors of the tokenizer, for errors.Is.
var (
	// ErrUnsupported marks a tokenizer.json or chat request using a feature
	// this package does not implement; callers fall back to the model
	// server.
	ErrUnsupported = errors.New("tokenizer feature not supported")
	// ErrInputTooLarge marks a prompt beyond Options.MaxInputBytes.
	ErrInputTooLarge = errors.New("input too large to tokenize")
	// ErrUnknownID marks an id outside the vocabulary when decoding.
	ErrUnknownID = errors.New("token id not in vocabulary")
	// ErrBadFile marks a tokenizer file that cannot be parsed.
	ErrBadFile = errors.New("malformed tokenizer file")
	// ErrTemplate marks a chat that cannot be rendered: no template, a
	// template error, or a raise_exception from the template itself.
	ErrTemplate = errors.New("chat template")
)

// Defaults of Options.
const (
	DefaultSegmentCacheBytes = 64 << 20
	DefaultMaxInputBytes     = 8 << 20
	// MinCachedSegment is the shortest segment whose ids are cached:
	// shorter ones tokenize faster than the cache would pay for itself in
	// memory.
	MinCachedSegment = 256
)

// Options configure a Tokenizer. The zero value of each field means its
// default.
type Options struct {
	// Name labels the tokenizer's metrics, usually the model name.
	Name string
	// SegmentCacheBytes bounds the memory of cached segment ids (default
	// 64 MiB; negative disables the cache).
	SegmentCacheBytes int64
	// WordCacheEntries bounds the cache of short pre-tokens (default 65536;
	// negative disables it).
	WordCacheEntries int
	// MaxInputBytes bounds the text one call tokenizes (default 8 MiB);
	// longer input fails with ErrInputTooLarge.
	MaxInputBytes int
	// Registerer receives the metrics; nil means they are not registered.
	// Tokenizers of several models may share one: their series differ by
	// the model label.
	Registerer prometheus.Registerer
}

// Tokenizer turns text into token ids exactly as the reference tokenizer
// library does for the same tokenizer.json. It is safe for concurrent use.
type Tokenizer struct {
	name        string
	normalize   normalizer
	split       splitter
	prefixSpace bool
	model       *bpe
	// added matches the added tokens in raw text; normAdded those flagged
	// normalized, in normalized text.
	added     *addedMatcher
	normAdded *addedMatcher
	addedIDs  []uint32 // by matcher token index, for both matchers
	normIDs   []uint32
	post      postProcessor
	chat      *chatTemplate
	segments  *segmentCache
	maxInput  int
	// m is swapped when a Local registers the tokenizer's series, which
	// may happen while another Local uses it.
	m atomic.Pointer[modelMetrics]
}

// VocabSize is the number of ids the tokenizer can produce.
func (t *Tokenizer) VocabSize() int { return t.model.tokens.len() }

// Encode returns the ids of text. With addSpecialTokens the post-processor's
// tokens (a BOS, for Llama-style templates) surround them, as the model
// server does for a completion prompt. Special-token text inside text is
// always recognised as the special token, as the server does. Invalid UTF-8
// is replaced, byte by byte, with U+FFFD, as a JSON decoder would.
func (t *Tokenizer) Encode(text string, addSpecialTokens bool) ([]uint32, error) {
	if len(text) > t.maxInput {
		t.metrics().rejected.WithLabelValues(t.name, "too_large").Inc()
		return nil, fmt.Errorf("tokenize %d bytes: %w (limit %d)", len(text), ErrInputTooLarge, t.maxInput)
	}
	if !utf8.ValidString(text) {
		t.metrics().invalidUTF8.WithLabelValues(t.name).Inc()
		text = replaceInvalid(text)
	}
	ids := t.encode(make([]uint32, 0, len(text)/3+4), text)
	if addSpecialTokens {
		ids = t.post.apply(ids)
	}
	t.metrics().tokens.WithLabelValues(t.name).Add(float64(len(ids)))
	return ids, nil
}

// encode appends the ids of valid UTF-8 text without post-processing.
func (t *Tokenizer) encode(dst []uint32, text string) []uint32 {
	var buf [16]piece
	for _, p := range t.added.split(text, buf[:0]) {
		if p.token >= 0 {
			dst = append(dst, t.addedIDs[p.token])
			continue
		}
		dst = t.encodeSegment(dst, text[p.start:p.end])
	}
	return dst
}

// encodeSegment appends the ids of text between added tokens. Such a
// segment tokenizes the same wherever it appears, which is what makes its
// cached ids exact.
func (t *Tokenizer) encodeSegment(dst []uint32, seg string) []uint32 {
	if t.segments == nil || len(seg) < MinCachedSegment {
		return t.encodeFresh(dst, seg)
	}
	key := segmentKey(seg)
	if ids, ok := t.segments.get(key); ok {
		t.metrics().segmentLookups.WithLabelValues(t.name, "hit").Inc()
		return append(dst, ids...)
	}
	t.metrics().segmentLookups.WithLabelValues(t.name, "miss").Inc()
	start := len(dst)
	dst = t.encodeFresh(dst, seg)
	t.segments.put(key, dst[start:], t.metrics())
	return dst
}

func (t *Tokenizer) encodeFresh(dst []uint32, seg string) []uint32 {
	if t.normalize == nil {
		return t.encodeNormalized(dst, seg)
	}
	seg = t.normalize(seg)
	if t.normAdded == nil {
		return t.encodeNormalized(dst, seg)
	}
	var buf [8]piece
	for _, p := range t.normAdded.split(seg, buf[:0]) {
		if p.token >= 0 {
			dst = append(dst, t.normIDs[p.token])
			continue
		}
		dst = t.encodeNormalized(dst, seg[p.start:p.end])
	}
	return dst
}

// encodeNormalized pre-tokenizes and merges one normalized segment.
func (t *Tokenizer) encodeNormalized(dst []uint32, seg string) []uint32 {
	if seg == "" {
		return dst
	}
	if t.prefixSpace && seg[0] != ' ' {
		seg = " " + seg
	}
	var buf [64]int
	ends, err := t.split.split(seg, buf[:0])
	if err != nil {
		// Only the regexp fallback can fail (a timeout it never sets), and
		// its input is valid UTF-8; treat the segment as one pre-token
		// rather than lose it.
		ends = append(ends[:0], len(seg))
	}
	start := 0
	for _, end := range ends {
		dst = t.model.encodeWord(dst, seg[start:end])
		start = end
	}
	return dst
}

// Decode returns the bytes the ids stand for; for ids from Encode of valid
// UTF-8 text without special tokens added, that is the text itself.
func (t *Tokenizer) Decode(ids []uint32) ([]byte, error) {
	var out []byte
	for _, id := range ids {
		b, ok := t.model.token(id)
		if !ok {
			return out, fmt.Errorf("decode id %d: %w", id, ErrUnknownID)
		}
		out = append(out, b...)
	}
	return out, nil
}

// replaceInvalid replaces each byte of s that is not part of valid UTF-8
// with U+FFFD.
func replaceInvalid(s string) string {
	out := make([]byte, 0, len(s)+8)
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 {
			out = utf8.AppendRune(out, utf8.RuneError)
		} else {
			out = append(out, s[i:i+n]...)
		}
		i += n
	}
	return string(out)
}

// Register moves the tokenizer's series to reg, for a tokenizer loaded
// before its registry was known; what was counted before stays with the
// previous collectors. Tokenizers of several models may share reg.
func (t *Tokenizer) Register(reg prometheus.Registerer) { t.m.Store(metricsFor(reg)) }

func (t *Tokenizer) metrics() *modelMetrics { return t.m.Load() }
