package index

import (
	"encoding/binary"
	"math"
	"math/bits"
	"slices"

	"github.com/cespare/xxhash/v2"

	"github.com/kvroute/kvroute/pkg/events"
)

// Block keys are kvroute's own names for prompt prefixes, computed the same
// way from an event's token_ids and from a request's tokens, so that a
// request finds the blocks any engine holds whatever that engine's own
// (unportable) hashes are.
//
// A key carries 61 bits of xxhash64: its low three bits are always zero, so
// that the index can keep a block's tier set beside its key in one word. At
// ten million distinct blocks the chance of any collision stays near 1e-5.
const (
	keyLowBits = 3
	keyMask    = ^uint64(1<<keyLowBits - 1)
)

// keyChunkTokens is the largest block vLLM uses, in tokens (its sizes are
// 16 to 64); keys of blocks either side of it are tested against the
// library's hash.
const keyChunkTokens = 64

// Domain tags keep the three kinds of hash input apart, so that no root can
// equal a chained key or a marked one by construction of the input bytes.
const (
	tagRoot       = 'R'
	tagMarked     = 'M'
	tagBigramRoot = 'B'
)

// RootKey is the key every block chain starts from: the base model, the LoRA
// adapter (empty for none) and the cache salt (empty for none). Each string
// is length-prefixed, so ("ab", "c") and ("a", "bc") differ.
func RootKey(model, lora, salt string) uint64 { return rootKey(tagRoot, model, lora, salt) }

// BigramRootKey is RootKey for engines that key blocks by pairs of adjacent
// tokens (SGLang with EAGLE speculative decoding), whose chains must never
// meet those of engines that do not.
func BigramRootKey(model, lora, salt string) uint64 { return rootKey(tagBigramRoot, model, lora, salt) }

func rootKey(tag byte, model, lora, salt string) uint64 {
	var d xxhash.Digest
	d.Reset()
	var head [1]byte
	head[0] = tag
	_, _ = d.Write(head[:])
	writeString(&d, model)
	writeString(&d, lora)
	writeString(&d, salt)
	return d.Sum64() & keyMask
}

// AppendBlockKeys appends the keys of tokens' full blocks to dst, chained
// from parent: k_i = H(k_{i-1}, tokens of block i), with k_{-1} = parent
// (a RootKey for a prompt's first block). A trailing partial block has no
// key, as engines cache only full blocks. Nothing is allocated beyond
// growing dst.
func AppendBlockKeys(dst []uint64, parent uint64, tokens []uint32, blockSize int) []uint64 {
	if blockSize <= 0 {
		return dst
	}
	n := len(tokens) / blockSize
	dst = slices.Grow(dst, n)
	for i := 0; i < n; i++ {
		parent = blockKey(parent, tokens[i*blockSize:(i+1)*blockSize])
		dst = append(dst, parent)
	}
	return dst
}

// AppendBigramBlockKeys is AppendBlockKeys for engines that key blocks by
// pairs of adjacent tokens: block i covers tokens[i*blockSize :
// (i+1)*blockSize+1], the token after the block included, so a block has a
// key only once the token after it is known. parent is a BigramRootKey for
// a prompt's first block.
func AppendBigramBlockKeys(dst []uint64, parent uint64, tokens []uint32, blockSize int) []uint64 {
	if blockSize <= 0 || len(tokens) == 0 {
		return dst
	}
	n := (len(tokens) - 1) / blockSize
	dst = slices.Grow(dst, n)
	for i := 0; i < n; i++ {
		parent = blockKey(parent, tokens[i*blockSize:(i+1)*blockSize+1])
		dst = append(dst, parent)
	}
	return dst
}

// blockKey chains one block's tokens onto its parent's key: xxhash64 of
// the parent and then each token, all little-endian, whatever the
// machine's byte order.
func blockKey(parent uint64, tokens []uint32) uint64 {
	return sumKeyInput(parent, tokens) & keyMask
}

// xxhash64's primes.
const (
	xxPrime1 uint64 = 11400714785074694791
	xxPrime2 uint64 = 14029467366897019727
	xxPrime3 uint64 = 1609587929392839161
	xxPrime4 uint64 = 9650029242287828579
	xxPrime5 uint64 = 2870177450012600261
	// The first and fourth lanes' starting values, prime1+prime2 and
	// -prime1 modulo 2^64.
	xxLane1 uint64 = 6983438078262162902
	xxLane4 uint64 = 7046029288634856825
)

// sumKeyInput is xxhash.Sum64 of parent's eight bytes followed by each
// token's four, computed from the values without writing those bytes
// out: each of the hash's 8-byte input words is the parent or a pair of
// tokens. This is a request's keying cost (a copy into a buffer and a
// call per block cost twice as much); TestBlockKeysAreXXHashOfTheirBytes
// and FuzzBlockKey hold it to the library's answer.
func sumKeyInput(parent uint64, tokens []uint32) uint64 {
	n := len(tokens)
	i := 0 // tokens consumed
	var h uint64
	if n >= 6 {
		// At least 32 bytes: four lanes over 32-byte stripes, the first
		// of which starts with the parent.
		v1 := xxRound(xxLane1, parent)
		v2 := xxRound(xxPrime2, pair(tokens[0:2]))
		v3 := xxRound(0, pair(tokens[2:4]))
		v4 := xxRound(xxLane4, pair(tokens[4:6]))
		for i = 6; n-i >= 8; i += 8 {
			t := tokens[i : i+8]
			v1 = xxRound(v1, pair(t[0:2]))
			v2 = xxRound(v2, pair(t[2:4]))
			v3 = xxRound(v3, pair(t[4:6]))
			v4 = xxRound(v4, pair(t[6:8]))
		}
		h = bits.RotateLeft64(v1, 1) + bits.RotateLeft64(v2, 7) + bits.RotateLeft64(v3, 12) + bits.RotateLeft64(v4, 18)
		h = xxMerge(h, v1)
		h = xxMerge(h, v2)
		h = xxMerge(h, v3)
		h = xxMerge(h, v4)
		h += uint64(8 + 4*n)
	} else {
		h = xxPrime5 + uint64(8+4*n)
		h = xxWord(h, parent)
	}
	for ; n-i >= 2; i += 2 {
		h = xxWord(h, pair(tokens[i:i+2]))
	}
	if i < n {
		h ^= uint64(tokens[i]) * xxPrime1
		h = bits.RotateLeft64(h, 23)*xxPrime2 + xxPrime3
	}
	h ^= h >> 33
	h *= xxPrime2
	h ^= h >> 29
	h *= xxPrime3
	h ^= h >> 32
	return h
}

// pair is the 8-byte little-endian word of two tokens.
func pair(t []uint32) uint64 { return uint64(t[0]) | uint64(t[1])<<32 }

func xxRound(acc, in uint64) uint64 {
	acc += in * xxPrime2
	acc = bits.RotateLeft64(acc, 31)
	return acc * xxPrime1
}

func xxMerge(acc, v uint64) uint64 {
	acc ^= xxRound(0, v)
	return acc*xxPrime1 + xxPrime4
}

// xxWord folds one 8-byte word of the input's tail into h.
func xxWord(h, w uint64) uint64 {
	h ^= xxRound(0, w)
	return bits.RotateLeft64(h, 27)*xxPrime1 + xxPrime4
}

// markedKey folds a block's extras into its key when they are something no
// plain request reproduces (multimodal item hashes, prompt-embedding
// digests). The block then never matches a plain request, while its children,
// chained from the marked key, stay consistent among themselves; folding the
// extras' content (not just a flag) keeps two images behind identical
// placeholder tokens apart.
func markedKey(key uint64, extra events.ExtraKey) uint64 {
	var d xxhash.Digest
	d.Reset()
	var head [9]byte
	head[0] = tagMarked
	binary.LittleEndian.PutUint64(head[1:], key)
	_, _ = d.Write(head[:])
	writeValue(&d, extra, 0)
	return d.Sum64() & keyMask
}

func writeString(d *xxhash.Digest, s string) {
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(s)))
	_, _ = d.Write(n[:])
	_, _ = d.WriteString(s)
}

// maxExtraDepth bounds recursion into nested extras from the network.
const maxExtraDepth = 8

// writeValue writes one decoded msgpack value with a type tag, so that the
// string "1" and the integer 1 hash differently.
func writeValue(d *xxhash.Digest, v any, depth int) {
	var b [9]byte
	put := func(tag byte, x uint64) {
		b[0] = tag
		binary.LittleEndian.PutUint64(b[1:], x)
		_, _ = d.Write(b[:])
	}
	if depth > maxExtraDepth {
		put('x', 0)
		return
	}
	if i, ok := asInt64(v); ok {
		put('i', uint64(i))
		return
	}
	switch x := v.(type) {
	case nil:
		put('n', 0)
	case string:
		put('s', uint64(len(x)))
		_, _ = d.WriteString(x)
	case []byte:
		put('b', uint64(len(x)))
		_, _ = d.Write(x)
	case uint64:
		put('u', x)
	case bool:
		if x {
			put('t', 1)
		} else {
			put('t', 0)
		}
	case float64:
		put('f', math.Float64bits(x))
	case float32:
		put('f', math.Float64bits(float64(x)))
	case events.ExtraKey:
		writeSlice(d, x, depth)
	case []any:
		writeSlice(d, x, depth)
	default:
		put('x', 1)
	}
}

func writeSlice(d *xxhash.Digest, xs []any, depth int) {
	var b [9]byte
	b[0] = 'a'
	binary.LittleEndian.PutUint64(b[1:], uint64(len(xs)))
	_, _ = d.Write(b[:])
	for _, x := range xs {
		writeValue(d, x, depth+1)
	}
}

// asInt64 reads any msgpack integer width as an int64; a uint64 above
// MaxInt64 is not one.
func asInt64(v any) (int64, bool) {
	switch x := v.(type) {
	case int:
		return int64(x), true
	case int8:
		return int64(x), true
	case int16:
		return int64(x), true
	case int32:
		return int64(x), true
	case int64:
		return x, true
	case uint:
		if uint64(x) <= math.MaxInt64 {
			return int64(x), true
		}
	case uint8:
		return int64(x), true
	case uint16:
		return int64(x), true
	case uint32:
		return int64(x), true
	case uint64:
		if x <= math.MaxInt64 {
			return int64(x), true
		}
	}
	return 0, false
}

// plainExtras reports whether a block's extras are exactly what a plain
// request (no multimodal input, no prompt embeddings) with the event's LoRA
// adapter produces, and if so the cache salt they carry. vLLM orders a
// block's extras as: LoRA (its name, or its integer id in older versions),
// multimodal hashes, cache_salt (first block of the prompt only), prompt
// embedding digests. A lone string on a first block is taken as the salt;
// a multimodal hash in that place cannot be told apart, but then it only
// matches a request whose salt is that very hash.
func plainExtras(extra events.ExtraKey, e *events.Event, firstBlock bool) (salt string, ok bool) {
	i := 0
	if i < len(extra) && isLoRAExtra(extra[i], e) {
		i++
	}
	if firstBlock && i < len(extra) {
		s, isStr := extra[i].(string)
		if !isStr {
			return "", false
		}
		salt = s
		i++
	}
	return salt, i == len(extra)
}

func isLoRAExtra(v any, e *events.Event) bool {
	if e.LoRAName != "" {
		if s, ok := v.(string); ok && s == e.LoRAName {
			return true
		}
	}
	if e.HasLoRAID {
		if n, ok := asInt64(v); ok && n == e.LoRAID {
			return true
		}
	}
	return false
}
