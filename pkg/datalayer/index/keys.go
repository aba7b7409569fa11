package index

import (
	"encoding/binary"
	"math"
	"slices"
	"unsafe"

	"github.com/cespare/xxhash/v2"
	"github.com/zeebo/xxh3"

	"github.com/kvroute/kvroute/pkg/events"
)

// Block keys are kvroute's own names for prompt prefixes, computed the same
// way from an event's token_ids and from a request's tokens, so that a
// request finds the blocks any engine holds whatever that engine's own
// (unportable) hashes are.
//
// A key carries 61 bits of a 64-bit hash (xxhash64 for roots and marked
// keys, XXH3-64 seeded with the parent for a chain's blocks): its low three
// bits are always zero, so that the index can keep a block's tier set
// beside its key in one word. At ten million distinct blocks the chance of
// any collision stays near 1e-5.
const (
	keyLowBits = 3
	keyMask    = ^uint64(1<<keyLowBits - 1)
)

// keyChunkTokens is the largest block vLLM uses, in tokens (its sizes are
// 16 to 64), and the portable key's buffer; keys of blocks either side of
// it are tested against the library's hash.
const keyChunkTokens = 64

// Domain tags keep the inputs of roots, bigram roots and marked keys apart
// by construction of their bytes. A chained key is another function of its
// input (XXH3 seeded with the parent), so that one equal to a root or a
// marked key is a 61-bit collision like any other.
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

// blockKey chains one block's tokens onto its parent's key: XXH3-64 of
// the tokens' bytes (each token four bytes, little-endian, whatever the
// machine's byte order) seeded with the parent key. The seed enters each
// of the hash's 16-byte mixes side by side, so that a chain of keys costs
// about one mix a block in sequence; the tokens' own mixing overlaps from
// block to block (a hash over the parent's bytes and then the tokens'
// cost two and a half times as much, its every round waiting on the
// parent). TestBlockKeysAreXXH3OfTheirBytes and FuzzBlockKey hold it to
// the library's hash of bytes written out one by one.
func blockKey(parent uint64, tokens []uint32) uint64 {
	if littleEndian {
		return xxh3.HashSeed(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(tokens))), 4*len(tokens)), parent) & keyMask
	}
	return blockKeyPortable(parent, tokens)
}

// blockKeyPortable is blockKey for machines whose memory order is not
// the key's: the tokens are written out little-endian, a stack buffer at
// a time, into the seeded streaming hash (which answers as the one-shot
// hash over the same bytes).
func blockKeyPortable(parent uint64, tokens []uint32) uint64 {
	var h xxh3.Hasher
	h.ResetSeed(parent)
	var buf [4 * keyChunkTokens]byte
	for len(tokens) > 0 {
		n := min(len(tokens), keyChunkTokens)
		for i, t := range tokens[:n] {
			binary.LittleEndian.PutUint32(buf[4*i:], t)
		}
		_, _ = h.Write(buf[:4*n])
		tokens = tokens[n:]
	}
	return h.Sum64() & keyMask
}

// littleEndian reports whether this machine keeps a uint32's bytes in
// the key's order, so that a block's tokens are the hash's input as they
// lie in memory.
var littleEndian = func() bool {
	x := uint32(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}()

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
