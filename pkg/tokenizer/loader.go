package tokenizer

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/dlclark/regexp2/v2"
)

// File names in a tokenizer directory, as model repositories lay them out.
const (
	TokenizerFile = "tokenizer.json"
	ConfigFile    = "tokenizer_config.json"
)

// Load reads a tokenizer from path: a directory holding tokenizer.json (and
// tokenizer_config.json, for chat templates), or a tokenizer.json file,
// whose directory is searched for tokenizer_config.json.
func Load(path string, opts Options) (*Tokenizer, error) {
	dir, file := path, filepath.Join(path, TokenizerFile)
	if st, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("load tokenizer: %w", err)
	} else if !st.IsDir() {
		dir, file = filepath.Dir(path), path
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("load tokenizer: %w", err)
	}
	config, err := os.ReadFile(filepath.Join(dir, ConfigFile))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("load tokenizer config: %w", err)
	}
	t, err := Parse(data, config, opts)
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", file, err)
	}
	return t, nil
}

// tokenizerFile is the part of tokenizer.json the byte-level BPE pipeline
// reads.
type tokenizerFile struct {
	AddedTokens   []addedToken    `json:"added_tokens"`
	Normalizer    json.RawMessage `json:"normalizer"`
	PreTokenizer  json.RawMessage `json:"pre_tokenizer"`
	PostProcessor json.RawMessage `json:"post_processor"`
	Model         struct {
		Type                    string            `json:"type"`
		Vocab                   map[string]uint32 `json:"vocab"`
		Merges                  json.RawMessage   `json:"merges"`
		IgnoreMerges            bool              `json:"ignore_merges"`
		ByteFallback            bool              `json:"byte_fallback"`
		Dropout                 *float64          `json:"dropout"`
		ContinuingSubwordPrefix *string           `json:"continuing_subword_prefix"`
		EndOfWordSuffix         *string           `json:"end_of_word_suffix"`
	} `json:"model"`
}

// Parse builds a tokenizer from the contents of tokenizer.json and,
// optionally (nil), tokenizer_config.json.
func Parse(tokenizerJSON, configJSON []byte, opts Options) (*Tokenizer, error) {
	var f tokenizerFile
	if err := json.Unmarshal(tokenizerJSON, &f); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadFile, err)
	}
	if f.Model.Type != "BPE" && f.Model.Type != "" {
		return nil, fmt.Errorf("%w: model type %q", ErrUnsupported, f.Model.Type)
	}
	if f.Model.ByteFallback || (f.Model.Dropout != nil && *f.Model.Dropout > 0) ||
		nonEmpty(f.Model.ContinuingSubwordPrefix) || nonEmpty(f.Model.EndOfWordSuffix) {
		return nil, fmt.Errorf("%w: BPE options other than byte-level", ErrUnsupported)
	}
	t := &Tokenizer{name: opts.Name, maxInput: opts.MaxInputBytes}
	if t.maxInput <= 0 {
		t.maxInput = DefaultMaxInputBytes
	}
	var err error
	if t.normalize, err = parseNormalizer(f.Normalizer); err != nil {
		return nil, err
	}
	if t.split, t.prefixSpace, err = parsePreTokenizer(f.PreTokenizer); err != nil {
		return nil, err
	}
	if t.post, err = parsePostProcessor(f.PostProcessor); err != nil {
		return nil, err
	}
	wordEntries := opts.WordCacheEntries
	if wordEntries == 0 {
		wordEntries = defaultWordKeys
	}
	if t.model, err = newBPE(f.Model.Vocab, f.Model.Merges, f.Model.IgnoreMerges, wordEntries); err != nil {
		return nil, err
	}
	var raw, normalized []addedToken
	for _, a := range f.AddedTokens {
		if a.Content == "" {
			continue
		}
		t.model.setToken(a.ID, []byte(a.Content))
		if a.Normalized && t.normalize != nil {
			// Normalized tokens are matched in normalized text, so their
			// own content is normalized alike.
			a.Content = t.normalize(a.Content)
			normalized = append(normalized, a)
			t.normIDs = append(t.normIDs, a.ID)
		} else {
			raw = append(raw, a)
			t.addedIDs = append(t.addedIDs, a.ID)
		}
	}
	t.model.freeze()
	t.added, t.normAdded = newAddedMatcher(raw), newAddedMatcher(normalized)
	if len(configJSON) > 0 {
		if t.chat, err = parseChatConfig(configJSON); err != nil {
			return nil, err
		}
	}
	t.m.Store(metricsFor(opts.Registerer))
	if opts.SegmentCacheBytes == 0 {
		opts.SegmentCacheBytes = DefaultSegmentCacheBytes
	}
	if opts.SegmentCacheBytes > 0 {
		t.segments = newSegmentCache(opts.SegmentCacheBytes, t.name)
	}
	return t, nil
}

func nonEmpty(s *string) bool { return s != nil && *s != "" }

// parsePreTokenizer accepts what byte-level models use: a Split by pattern
// followed by a ByteLevel mapping without its own splitting, or a ByteLevel
// that splits with the GPT-2 pattern.
func parsePreTokenizer(raw json.RawMessage) (splitter, bool, error) {
	type preTok struct {
		Type           string            `json:"type"`
		Pretokenizers  []json.RawMessage `json:"pretokenizers"`
		Pattern        map[string]string `json:"pattern"`
		Behavior       string            `json:"behavior"`
		Invert         bool              `json:"invert"`
		AddPrefixSpace bool              `json:"add_prefix_space"`
		UseRegex       *bool             `json:"use_regex"`
	}
	var top preTok
	if isNull(raw) {
		return nil, false, fmt.Errorf("%w: no pre_tokenizer (byte-level BPE needs one)", ErrUnsupported)
	}
	if err := json.Unmarshal(raw, &top); err != nil {
		return nil, false, fmt.Errorf("%w: pre_tokenizer: %w", ErrBadFile, err)
	}
	steps := []json.RawMessage{raw}
	if top.Type == "Sequence" {
		steps = top.Pretokenizers
	}
	var (
		sp          splitter
		byteLevel   bool
		prefixSpace bool
	)
	for _, s := range steps {
		var p preTok
		if err := json.Unmarshal(s, &p); err != nil {
			return nil, false, fmt.Errorf("%w: pre_tokenizer: %w", ErrBadFile, err)
		}
		switch p.Type {
		case "Split":
			if sp != nil || byteLevel {
				return nil, false, fmt.Errorf("%w: pre_tokenizer steps in this order", ErrUnsupported)
			}
			if p.Behavior != "Isolated" || p.Invert {
				return nil, false, fmt.Errorf("%w: Split behavior %q (invert %v)", ErrUnsupported, p.Behavior, p.Invert)
			}
			pattern, ok := p.Pattern["Regex"]
			if !ok {
				s, ok := p.Pattern["String"]
				if !ok {
					return nil, false, fmt.Errorf("%w: Split without a pattern", ErrBadFile)
				}
				pattern = regexp2.Escape(s)
			}
			var err error
			if sp, err = newSplitter(pattern); err != nil {
				return nil, false, err
			}
		case "ByteLevel":
			byteLevel, prefixSpace = true, p.AddPrefixSpace
			if p.UseRegex == nil || *p.UseRegex {
				if sp != nil {
					return nil, false, fmt.Errorf("%w: ByteLevel splitting after a Split", ErrUnsupported)
				}
				var err error
				if sp, err = newSplitter(patternGPT2); err != nil {
					return nil, false, err
				}
			}
		default:
			return nil, false, fmt.Errorf("%w: pre_tokenizer %q", ErrUnsupported, p.Type)
		}
	}
	if !byteLevel {
		return nil, false, fmt.Errorf("%w: pre_tokenizer without ByteLevel", ErrUnsupported)
	}
	if sp == nil {
		sp = wholeSplitter{}
	}
	return sp, prefixSpace, nil
}

// wholeSplitter keeps a segment as one pre-token.
type wholeSplitter struct{}

func (wholeSplitter) split(s string, dst []int) ([]int, error) { return append(dst, len(s)), nil }

func newBPE(vocab map[string]uint32, mergesRaw json.RawMessage, ignoreMerges bool, wordEntries int) (*bpe, error) {
	if len(vocab) == 0 {
		return nil, fmt.Errorf("%w: empty vocabulary", ErrBadFile)
	}
	keyBytes := 0
	for tok := range vocab {
		keyBytes += len(tok)
	}
	m := &bpe{vocab: newStrTable(len(vocab), keyBytes), ignoreMerges: ignoreMerges, words: newWordCache(wordEntries)}
	// In id order, so that the tables come out the same for the same file.
	byID := make([]string, 0, len(vocab))
	for tok := range vocab {
		byID = append(byID, tok)
	}
	slices.SortFunc(byID, func(a, b string) int { return cmp.Or(cmp.Compare(vocab[a], vocab[b]), strings.Compare(a, b)) })
	for _, tok := range byID {
		id := vocab[tok]
		b, err := byteLevelDecode(tok)
		if err != nil {
			// Not a byte-level token (a stray added token in the
			// vocabulary): it can only be produced as an added token.
			m.setToken(id, []byte(tok))
			continue
		}
		m.setToken(id, b)
		m.vocab.put(b, id)
		if len(b) == 1 {
			m.byteID[b[0]], m.hasByte[b[0]] = id, true
		}
	}
	pairs, err := parseMerges(mergesRaw)
	if err != nil {
		return nil, err
	}
	m.merges = newPairTable(len(pairs))
	for rank, p := range pairs {
		a, okA := vocab[p[0]]
		b, okB := vocab[p[1]]
		c, okC := vocab[p[0]+p[1]]
		if !okA || !okB || !okC {
			return nil, fmt.Errorf("%w: merge %d (%q %q) names a token outside the vocabulary", ErrBadFile, rank, p[0], p[1])
		}
		m.merges.put(pairKey(a, b), merge{rank: uint32(rank), id: c})
	}
	return m, nil
}

// setToken records id's bytes while loading; freeze lays them out.
func (m *bpe) setToken(id uint32, b []byte) {
	const maxID = 1 << 22 // far beyond any vocabulary; bounds memory on bad files
	if id >= maxID {
		return
	}
	for int(id) >= len(m.pending) {
		m.pending = append(m.pending, nil)
	}
	if b == nil {
		b = []byte{}
	}
	m.pending[id] = b
}

// parseMerges reads merges in either spelling tokenizer.json uses:
// "a b" strings or [a, b] pairs.
func parseMerges(raw json.RawMessage) ([][2]string, error) {
	if isNull(raw) {
		return nil, nil
	}
	if t := bytes.TrimSpace(raw); len(t) > 1 && t[0] == '[' {
		var asPairs [][2]string
		if err := json.Unmarshal(raw, &asPairs); err == nil {
			return asPairs, nil
		}
	}
	var asStrings []string
	if err := json.Unmarshal(raw, &asStrings); err != nil {
		return nil, fmt.Errorf("%w: merges: %w", ErrBadFile, err)
	}
	out := make([][2]string, len(asStrings))
	for i, s := range asStrings {
		a, b, ok := strings.Cut(s, " ")
		if !ok {
			return nil, fmt.Errorf("%w: merge %d %q is not a pair", ErrBadFile, i, s)
		}
		out[i] = [2]string{a, b}
	}
	return out, nil
}

// LoadModels loads one tokenizer per model from specs of the form
// MODEL=PATH, PATH being a tokenizer directory or tokenizer.json. Each
// tokenizer's metrics carry its model name.
func LoadModels(specs []string, opts Options) (map[string]*Tokenizer, error) {
	out := make(map[string]*Tokenizer, len(specs))
	for _, spec := range specs {
		model, path, ok := strings.Cut(spec, "=")
		if !ok || model == "" || path == "" {
			return nil, fmt.Errorf("tokenizer %q: want MODEL=PATH", spec)
		}
		if _, dup := out[model]; dup {
			return nil, fmt.Errorf("tokenizer for model %q given twice", model)
		}
		o := opts
		o.Name = model
		t, err := Load(path, o)
		if err != nil {
			return nil, fmt.Errorf("tokenizer for model %q: %w", model, err)
		}
		out[model] = t
	}
	return out, nil
}
