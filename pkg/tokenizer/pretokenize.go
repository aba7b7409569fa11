package tokenizer

import (
	"fmt"
	"unicode"
	"unicode/utf8"

	"github.com/dlclark/regexp2/v2"
)

// splitter cuts a normalized segment into pre-tokens, appending their end
// offsets to dst (each pre-token starts where the previous one ended).
type splitter interface {
	split(s string, dst []int) ([]int, error)
}

// The Split patterns whose scanners are written by hand. Both are the
// "Isolated" split of every match; the scanners reproduce the backtracking
// regexp's leftmost-alternative semantics, which the equivalence tests check
// against regexp2 itself.
const (
	// patternDigits3 is Llama 3's (and cl100k's) pattern: numbers in groups
	// of up to three digits.
	patternDigits3 = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// patternDigits1 is Qwen 2/3's: every digit alone.
	patternDigits1 = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// patternGPT2 is the pattern of the ByteLevel pre-tokenizer's own
	// splitting (use_regex), as GPT-2 and RoBERTa use it.
	patternGPT2 = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
)

// newSplitter returns the fastest splitter equivalent to pattern.
func newSplitter(pattern string) (splitter, error) {
	switch pattern {
	case patternDigits3:
		return scanner{maxDigits: 3}, nil
	case patternDigits1:
		return scanner{maxDigits: 1}, nil
	}
	re, err := regexp2.Compile(pattern, regexp2.None)
	if err != nil {
		return nil, fmt.Errorf("%w: split pattern %q: %w", ErrUnsupported, pattern, err)
	}
	return regexpSplitter{re: re}, nil
}

// scanner is the hand-written equivalent of patternDigits3/patternDigits1.
type scanner struct {
	maxDigits int
}

// class of a rune as the pattern sees it.
type class uint8

const (
	classLetter class = iota
	classNumber
	classSpace   // \s, but not \r or \n
	classNewline // \r or \n
	classOther   // [^\s\p{L}\p{N}]
	classEnd     // past the end of the text
)

func classify(r rune) class {
	if r < utf8.RuneSelf {
		return asciiClass[r]
	}
	switch {
	case unicode.IsLetter(r):
		return classLetter
	case unicode.IsNumber(r):
		return classNumber
	case unicode.IsSpace(r):
		return classSpace
	}
	return classOther
}

var asciiClass = func() (t [utf8.RuneSelf]class) {
	for r := range rune(utf8.RuneSelf) {
		switch {
		case r == '\r' || r == '\n':
			t[r] = classNewline
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z':
			t[r] = classLetter
		case r >= '0' && r <= '9':
			t[r] = classNumber
		case r == ' ' || r == '\t' || r == '\v' || r == '\f':
			t[r] = classSpace
		default:
			t[r] = classOther
		}
	}
	return t
}()

// at decodes the rune at i; past the end it returns classEnd, which no
// part of the pattern matches.
func at(s string, i int) (rune, class, int) {
	if i >= len(s) {
		return -1, classEnd, 0
	}
	if c := s[i]; c < utf8.RuneSelf {
		return rune(c), asciiClass[c], 1
	}
	r, n := utf8.DecodeRuneInString(s[i:])
	return r, classify(r), n
}

func (sc scanner) split(s string, dst []int) ([]int, error) {
	for i := 0; i < len(s); {
		i = sc.next(s, i)
		dst = append(dst, i)
	}
	return dst, nil
}

// next returns the end of the match starting at i, trying the pattern's
// alternatives in order.
func (sc scanner) next(s string, i int) int {
	r, c, n := at(s, i)
	// (?i:'s|'t|'re|'ve|'m|'ll|'d), ASCII case folding only.
	if r == '\'' {
		if end := contraction(s, i+1); end > 0 {
			return end
		}
	}
	switch c {
	case classLetter:
		// [^\r\n\p{L}\p{N}]?\p{L}+ with the optional part empty.
		return letters(s, i+n)
	case classNumber:
		// \p{N}{1,maxDigits}
		j := i + n
		for k := 1; k < sc.maxDigits; k++ {
			_, c2, n2 := at(s, j)
			if c2 != classNumber {
				break
			}
			j += n2
		}
		return j
	case classOther, classSpace:
		// [^\r\n\p{L}\p{N}]?\p{L}+ with one leading rune.
		if _, c2, n2 := at(s, i+n); c2 == classLetter {
			return letters(s, i+n+n2)
		}
	}
	// ` ?[^\s\p{L}\p{N}]+[\r\n]*`
	j := i
	if r == ' ' {
		if _, c2, _ := at(s, i+1); c2 == classOther {
			j = i + 1
		}
	}
	if _, c2, _ := at(s, j); c2 == classOther {
		for {
			_, c3, n3 := at(s, j)
			if c3 != classOther {
				break
			}
			j += n3
		}
		for j < len(s) && (s[j] == '\r' || s[j] == '\n') {
			j++
		}
		return j
	}
	// Only whitespace is left: c is classSpace or classNewline.
	end, lastNewline := i, -1
	for {
		_, c2, n2 := at(s, end)
		if c2 != classSpace && c2 != classNewline {
			break
		}
		if c2 == classNewline {
			lastNewline = end
		}
		end += n2
	}
	// \s*[\r\n]+: backtracking leaves the run just after its last newline.
	if lastNewline >= 0 {
		return lastNewline + 1
	}
	// \s+(?!\S): the whole run at the end of the text, else all of it but
	// its last rune, so that rune can lead the next word.
	if end == len(s) {
		return end
	}
	if _, lastSize := utf8.DecodeLastRuneInString(s[:end]); end-lastSize > i {
		return end - lastSize
	}
	// \s+: a single space before a non-space.
	return end
}

func letters(s string, j int) int {
	for {
		_, c, n := at(s, j)
		if c != classLetter {
			return j
		}
		j += n
	}
}

// contraction returns the end of 's 't 're 've 'm 'll 'd after the
// apostrophe ending at i, or 0.
func contraction(s string, i int) int {
	lower := func(k int) byte {
		if k >= len(s) {
			return 0
		}
		b := s[k]
		if b >= 'A' && b <= 'Z' {
			b += 'a' - 'A'
		}
		return b
	}
	switch lower(i) {
	case 's', 't', 'm', 'd':
		return i + 1
	case 'r', 'v':
		if lower(i+1) == 'e' {
			return i + 2
		}
	case 'l':
		if lower(i+1) == 'l' {
			return i + 2
		}
	}
	return 0
}

// regexpSplitter runs any other Split pattern with a backtracking regexp
// engine; the text between matches becomes pre-tokens too, as with the
// reference's Isolated behaviour.
type regexpSplitter struct {
	re *regexp2.Regexp
}

func (rs regexpSplitter) split(s string, dst []int) ([]int, error) {
	matches, err := rs.re.FindAllStringIndex(s, -1)
	if err != nil {
		return dst, fmt.Errorf("split: %w", err)
	}
	last := 0
	for _, m := range matches {
		if m[0] > last {
			dst = append(dst, m[0])
		}
		if m[1] > m[0] {
			dst = append(dst, m[1])
			last = m[1]
		}
	}
	if last < len(s) {
		dst = append(dst, len(s))
	}
	return dst, nil
}
