package openai

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"math"
	"math/bits"
	"slices"

	"github.com/kvroute/kvroute/pkg/jsonscan"
)

// The body is validated in the same pass that splits it into members,
// with jsonscan's checker, which accepts exactly what encoding/json accepts
// (FuzzSplitBody holds the two together). A separate json.Valid pass
// cost more than everything else ParseRequest does: it steps a state
// machine through a function call per byte, over a body that for an
// 8k-token prompt is 50 KB of digits and commas.

// body is a request body split into the members that are read; the others
// are only validated.
type body struct {
	fields [numFields]json.RawMessage // nil when absent
	// promptIDs is the prompt member read as token ids, set only when the
	// prompt is a flat array of them (tokenIDs likewise for generate's
	// token_ids). The ids are read while validating,
	// so that the body's largest part is scanned once, not twice.
	promptIDs []uint32
	tokenIDs  []uint32
}

// field is a member of a request body that is read.
type field int

const (
	fieldModel field = iota
	fieldStream
	fieldCacheSalt
	fieldMaxCompletionTokens
	fieldMaxTokens
	fieldAddSpecialTokens
	fieldPrompt
	fieldPromptEmbeds
	fieldMessages
	fieldAddGenerationPrompt
	fieldContinueFinalMessage
	fieldChatTemplate
	fieldChatTemplateKwargs
	fieldTools
	fieldSystem
	fieldInput
	fieldInstructions
	fieldTokenIDs
	fieldSamplingParams
	fieldPreviousResponseID
	fieldMaxOutputTokens
	numFields
)

var fieldNames = [numFields]string{
	"model", "stream", "cache_salt", "max_completion_tokens", "max_tokens", "add_special_tokens",
	"prompt", "prompt_embeds", "messages", "add_generation_prompt", "continue_final_message",
	"chat_template", "chat_template_kwargs", "tools",
	"system", "input", "instructions", "token_ids", "sampling_params", "previous_response_id", "max_output_tokens",
}

// fieldOf returns the field a member's decoded key names; ok is false for
// any other key.
func fieldOf(key []byte) (f field, ok bool) {
	for f, name := range fieldNames {
		if string(key) == name {
			return field(f), true
		}
	}
	return 0, false
}

// splitBody checks that b, which starts with '{', is exactly one valid JSON
// object (with only whitespace after it) and returns the members that are
// read (those fieldNames names). A key
// given twice keeps its last value, as with encoding/json. ok is false when
// b is not valid JSON. A prompt of token ids is read into idBuf's backing
// array when it is large enough (see ParseRequestInto).
func splitBody(b []byte, idBuf []uint32) (out body, ok bool, err error) {
	i := jsonscan.SkipSpace(b, 1)
	if i < len(b) && b[i] == '}' {
		return out, jsonscan.SkipSpace(b, i+1) == len(b), nil
	}
	bufField := field(-1) // the member whose ids idBuf holds
	for {
		if i >= len(b) || b[i] != '"' {
			return out, false, nil
		}
		keyEnd, ok := jsonscan.ValidString(b, i)
		if !ok {
			return out, false, nil
		}
		// Keys are matched as decoded, but only one with an escape needs
		// decoding: the names are ASCII, and invalid UTF-8, which decodes
		// to U+FFFD, matches none of them either way.
		key := b[i+1 : keyEnd-1]
		if bytes.IndexByte(key, '\\') >= 0 {
			k, err := jsonscan.DecodeString(b[i:keyEnd])
			if err != nil {
				return out, false, err
			}
			key = []byte(k)
		}
		f, read := fieldOf(key)
		i = jsonscan.SkipSpace(b, keyEnd)
		if i >= len(b) || b[i] != ':' {
			return out, false, nil
		}
		i = jsonscan.SkipSpace(b, i+1)
		start := i
		var ids []uint32
		if read && (f == fieldPrompt || f == fieldTokenIDs) && i < len(b) && b[i] == '[' {
			// The ids of prompt and of token_ids, when a body has both,
			// must not share memory; a key given twice keeps its last.
			dst := idBuf
			if bufField >= 0 && bufField != f {
				dst = nil
			}
			ids, i, ok = scanTokenIDs(b, i, dst)
			if ok && bufField < 0 {
				bufField = f
			}
		} else {
			ok = false
		}
		if !ok {
			// Not a flat array of token ids: validated as any value, and
			// read later by whatever reads the member.
			if i, ok = jsonscan.ValidValue(b, start, 1); !ok {
				return out, false, nil
			}
		}
		if read {
			out.fields[f] = b[start:i:i]
			switch f {
			case fieldPrompt:
				out.promptIDs = ids
			case fieldTokenIDs:
				out.tokenIDs = ids
			}
		}
		i = jsonscan.SkipSpace(b, i)
		switch {
		case i < len(b) && b[i] == ',':
			i = jsonscan.SkipSpace(b, i+1)
		case i < len(b) && b[i] == '}':
			return out, jsonscan.SkipSpace(b, i+1) == len(b), nil
		default:
			return out, false, nil
		}
	}
}

// scanTokenIDs reads the array at b[i] when it is valid JSON made only of
// integers from 0 to MaxUint32, and returns the ids and the index just
// past the array. ok is false for anything else, empty arrays included; the
// caller then validates the array as any value, and parseTokenIDs says what
// is wrong with it. The ids are appended to dst[:0], which is grown if it is
// too small.
func scanTokenIDs(b []byte, i int, dst []uint32) (ids []uint32, end int, ok bool) {
	i = jsonscan.SkipSpace(b, i+1)
	if i >= len(b) || b[i] == ']' {
		return nil, i, false
	}
	ids = dst[:0]
	for {
		// Most of the array is read by readIDs; what it leaves (the
		// array's end, an id of more than eight digits, whitespace other
		// than one space after a comma, or whatever is not valid) is read
		// here, an id at a time.
		n, next := readIDs(b, i, ids[len(ids):cap(ids)])
		ids, i = ids[:len(ids)+n], jsonscan.SkipSpace(b, next)
		start := i
		var v uint64
		for i < len(b) && b[i]-'0' <= 9 {
			v = v*10 + uint64(b[i]-'0')
			i++
		}
		// The range is checked once per id, not per digit: ten digits
		// cannot overflow a uint64.
		if n := i - start; n == 0 || n > 10 || v > math.MaxUint32 || (b[start] == '0' && n > 1) {
			return nil, i, false
		}
		if len(ids) == cap(ids) {
			// Out of room: grown once, for the rest of a flat array, which
			// ends at the first ']' and has an id after each comma.
			last := bytes.IndexByte(b[i:], ']')
			if last < 0 {
				return nil, i, false
			}
			ids = slices.Grow(ids, bytes.Count(b[i:i+last], []byte{','})+1)
		}
		ids = append(ids, uint32(v))
		i = jsonscan.SkipSpace(b, i)
		if i >= len(b) {
			return nil, i, false
		}
		switch b[i] {
		case ']':
			return ids, i + 1, true
		case ',':
			i = jsonscan.SkipSpace(b, i+1)
		default:
			// A fraction, an exponent or anything else.
			return nil, i, false
		}
	}
}

// readIDs reads ids as scanIDBlocks does, with scanIDsAVX2 first where the
// CPU has it.
func readIDs(b []byte, s int, out []uint32) (k, next int) {
	for useIDsAVX2 {
		// 16 KiB at a time (some 2,000 ids, microseconds): the goroutine
		// cannot be preempted inside assembly.
		end := min(len(b), s+16<<10)
		n, at := scanIDsAVX2(b[:end], s, out[k:])
		k, s = k+n, at
		if n == 0 || end == len(b) {
			break
		}
	}
	n, next := scanIDBlocks(b, s, out[k:])
	return k + n, next
}

// scanIDBlocks reads ids into out from b[s], the start of one, for as long
// as they have at most eight digits and are separated by "," or ", " (as
// encoding/json and Python's json.dumps write them), and out has room. It
// returns how many it read and where it stopped: at the start of an id it
// has not read, or just past a comma. It reads only valid ids, each
// followed by a comma.
//
// The bytes that are not digits are marked 64 at a time, a bit each, and
// the ids read between the marks: reading an id so does not wait on
// finding where the one before it ended, as it does a byte at a time.
func scanIDBlocks(b []byte, s int, out []uint32) (k, next int) {
	// Each id is loaded as the eight bytes that end where it ends, so a
	// block is read with the eight bytes before it.
	if s < 8 {
		return 0, s
	}
	base, r := s, 0 // the block starts at b[base]; the id being read at b[base+r]
	for ; base <= len(b)-64; base += 64 {
		p := (*[72]byte)(b[base-8 : base+64])
		// Bit j of m: b[base+j] is not a digit.
		m := nonDigits8(binary.LittleEndian.Uint64(p[8:])) |
			nonDigits8(binary.LittleEndian.Uint64(p[16:]))<<8 |
			nonDigits8(binary.LittleEndian.Uint64(p[24:]))<<16 |
			nonDigits8(binary.LittleEndian.Uint64(p[32:]))<<24 |
			nonDigits8(binary.LittleEndian.Uint64(p[40:]))<<32 |
			nonDigits8(binary.LittleEndian.Uint64(p[48:]))<<40 |
			nonDigits8(binary.LittleEndian.Uint64(p[56:]))<<48 |
			nonDigits8(binary.LittleEndian.Uint64(p[64:]))<<56
		for ; m != 0; m &= m - 1 {
			j := bits.TrailingZeros64(m) & 63 // b[base+j] ends the id
			n := j - r
			if uint(n-1) < 8 {
				d := &idDigits[n]
				v := combine8(binary.LittleEndian.Uint64(p[j:])&d.mask ^ d.zeros)
				if v < d.least || p[8+j] != ',' || uint(k) >= uint(len(out)) {
					return k, base + r // a leading zero, no comma, or no room
				}
				out[k] = uint32(v)
				k++
				r = j + 1
				continue
			}
			if n == 0 && p[8+j] == ' ' && p[7+j] == ',' {
				r++
				continue
			}
			return k, base + r
		}
		r -= 64
	}
	return k, base + r
}

const ones = 0x0101010101010101

// idDigits[n], for an id of n digits loaded as the last n of eight bytes:
// the mask that keeps them, its '0's (to make them digit values), and the
// least value they have without a leading zero.
var idDigits = func() (d [9]struct{ mask, zeros, least uint64 }) {
	least := uint64(0)
	for n := 1; n <= 8; n++ {
		d[n].mask = ^uint64(0) << (64 - 8*n)
		d[n].zeros = d[n].mask & (0x30 * ones)
		d[n].least = least
		least = max(10*least, 10)
	}
	return d
}()

// nonDigits8 returns a bit for each of the eight bytes in x (loaded
// little-endian: bit k for the k-th byte) that is not a decimal digit.
func nonDigits8(x uint64) uint64 {
	// A byte is a digit when its low seven bits XOR '0' are below 10 and
	// its high bit is clear. Adding 0x76 to the seven bits sets the high
	// bit for 10 and up and cannot carry out of the byte.
	y := x ^ (0x30 * ones)
	t := ((y&(0x7F*ones) + 0x76*ones) | y) & (0x80 * ones)
	// Gather the eight high bits into the top byte: the bit of byte k
	// moves up by 7*(7-k), and no two products overlap.
	return t * 0x0002040810204081 >> 56
}

// combine8 returns the number whose decimal digits are the eight bytes of
// x, the first (most significant) in the lowest byte.
func combine8(x uint64) uint64 {
	x = x * (1 + 10<<8) >> 8 & 0x00FF00FF00FF00FF
	x = x * (1 + 100<<16) >> 16 & 0x0000FFFF0000FFFF
	return x * (1 + 10000<<32) >> 32
}
