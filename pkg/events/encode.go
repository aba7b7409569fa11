package events

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// Encoding chooses how AppendBatch writes events; the envelope is the same
// positional array in both.
type Encoding uint8

const (
	// EncodingArray writes each event as a tagged positional array, as
	// vLLM up to about 0.23 does.
	EncodingArray Encoding = iota
	// EncodingMap writes each event as a map with its tag under "type", as
	// vLLM 0.26 and later do.
	EncodingMap
)

func (enc Encoding) String() string {
	switch enc {
	case EncodingArray:
		return "array"
	case EncodingMap:
		return "map"
	}
	return fmt.Sprintf("Encoding(%d)", uint8(enc))
}

// ErrUnencodable is wrapped by every error AppendBatch returns: the batch
// holds something vLLM could not have sent.
var ErrUnencodable = errors.New("kv event batch cannot be encoded")

// AppendBatch appends b to dst as vLLM writes it (msgspec's rules: the tag
// first, fields in declaration order, fields still at their default left
// out, the smallest int encoding) and returns the extended buffer.
//
// Two facts the Event model does not keep are written the way vLLM writes
// them: ExtraKeys that are nil are left out, and group_idx is written
// whenever it is non-zero or a cache-spec field follows it.
func AppendBatch(dst []byte, b *Batch, enc Encoding) ([]byte, error) {
	if enc != EncodingArray && enc != EncodingMap {
		return dst, fmt.Errorf("%w: %v", ErrUnencodable, enc)
	}
	w := wireWriter{b: dst}
	m := msgpack.GetEncoder()
	defer msgpack.PutEncoder(m)
	m.Reset(&w)
	if err := appendEnvelope(&wireEncoder{Encoder: m, w: &w}, b, enc); err != nil {
		return dst, fmt.Errorf("%w: %w", ErrUnencodable, err)
	}
	return w.b, nil
}

// wireWriter lets the msgpack encoder append to a caller's slice.
type wireWriter struct{ b []byte }

func (w *wireWriter) Write(p []byte) (int, error) {
	w.b = append(w.b, p...)
	return len(p), nil
}

func (w *wireWriter) WriteByte(c byte) error {
	w.b = append(w.b, c)
	return nil
}

// wireEncoder wraps msgpack.Encoder so a sequence of writes reports its
// first error once instead of after every call.
// The encoder writes straight to w, so the hot int runs (hashes, tokens)
// can be appended to w directly, in between its writes.
type wireEncoder struct {
	*msgpack.Encoder
	w   *wireWriter
	err error
}

// appendUint appends v in its smallest msgpack encoding, as EncodeUint
// does, without a call through the writer interface per byte.
func (e *wireEncoder) appendUint(v uint64) {
	b := e.w.b
	switch {
	case v <= uint64(msgpcode.PosFixedNumHigh):
		b = append(b, byte(v))
	case v <= math.MaxUint8:
		b = append(b, msgpcode.Uint8, byte(v))
	case v <= math.MaxUint16:
		b = binary.BigEndian.AppendUint16(append(b, msgpcode.Uint16), uint16(v))
	case v <= math.MaxUint32:
		b = binary.BigEndian.AppendUint32(append(b, msgpcode.Uint32), uint32(v))
	default:
		b = binary.BigEndian.AppendUint64(append(b, msgpcode.Uint64), v)
	}
	e.w.b = b
}

func (e *wireEncoder) do(err error) {
	if e.err == nil {
		e.err = err
	}
}

func appendEnvelope(e *wireEncoder, b *Batch, enc Encoding) error {
	if b.HasDPRank && (b.DPRank < 0 || b.DPRank > math.MaxInt32) {
		return fmt.Errorf("data_parallel_rank %d out of range", b.DPRank)
	}
	n := 2
	if b.HasDPRank {
		n = 3
	}
	e.do(e.EncodeArrayLen(n))
	e.do(e.EncodeFloat64(b.TS))
	e.do(e.EncodeArrayLen(len(b.Events)))
	for i := range b.Events {
		if err := appendEvent(e, &b.Events[i], enc); err != nil {
			return fmt.Errorf("event %d: %w", i, err)
		}
	}
	if b.HasDPRank {
		e.do(e.EncodeInt(int64(b.DPRank)))
	}
	return e.err
}

func appendEvent(e *wireEncoder, ev *Event, enc Encoding) error {
	switch {
	case ev.Kind < KindBlockStored || ev.Kind > KindAllBlocksCleared:
		return fmt.Errorf("unknown kind %v", ev.Kind)
	case ev.Medium >= NumTiers:
		return fmt.Errorf("unknown medium %v", ev.Medium)
	case ev.BlockSize < 0 || ev.BlockSize > math.MaxInt32:
		return fmt.Errorf("block_size %d out of range", ev.BlockSize)
	case ev.GroupIdx < 0 || ev.GroupIdx > math.MaxInt32:
		return fmt.Errorf("group_idx %d out of range", ev.GroupIdx)
	case ev.SlidingWindow < 0 || ev.SlidingWindow > math.MaxInt32:
		return fmt.Errorf("kv_cache_spec_sliding_window %d out of range", ev.SlidingWindow)
	}
	if enc == EncodingArray && needsNames(ev) {
		// Fields of pending vLLM changes have no position: such an event
		// is written as a map, which every reader of this format accepts
		// beside array events.
		enc = EncodingMap
	}
	var buf [24]wireField
	fields := wireFields(buf[:0], ev, enc)
	switch enc {
	case EncodingArray:
		e.do(e.EncodeArrayLen(1 + len(fields)))
		e.do(e.EncodeString(ev.Kind.String()))
	case EncodingMap:
		e.do(e.EncodeMapLen(1 + len(fields)))
		e.do(e.EncodeString("type"))
		e.do(e.EncodeString(ev.Kind.String()))
	}
	for _, f := range fields {
		if enc == EncodingMap {
			e.do(e.EncodeString(f.String()))
		}
		if err := appendField(e, ev, f, enc); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
	}
	return e.err
}

// needsNames says whether ev carries a field that only map form can write.
func needsNames(ev *Event) bool {
	return len(ev.BlockOffsets) > 0 || len(ev.RemainingCopies) > 0
}

// presentFields appends to dst the fields msgspec writes for ev, in order.
// The fields that have defaults all come after the ones that do not; in map
// form every one still at its default is left out, in array form only the
// trailing run of them (an earlier one is written as its default).
func wireFields(dst []wireField, ev *Event, enc Encoding) []wireField {
	var all []wireField
	required := 0
	switch ev.Kind {
	case KindBlockStored:
		all, required = storedWireFields, 7 // block_hashes through lora_name
	case KindBlockRemoved:
		all, required = removedWireFields, 2 // block_hashes and medium
	default:
		return dst
	}
	dst = append(dst, all[:required]...)
	last := required
	for i := len(all) - 1; i >= required; i-- {
		if !isDefaultField(ev, all[i]) {
			last = i + 1
			break
		}
	}
	for _, f := range all[required:last] {
		if enc == EncodingArray || !isDefaultField(ev, f) {
			dst = append(dst, f)
		}
	}
	if enc == EncodingMap {
		named := storedNamedFields
		if ev.Kind == KindBlockRemoved {
			named = removedNamedFields
		}
		for _, f := range named {
			if !isDefaultField(ev, f) {
				dst = append(dst, f)
			}
		}
	}
	return dst
}

// isDefault says whether f holds the value msgspec would leave out.
func isDefaultField(ev *Event, f wireField) bool {
	switch f {
	case wireExtraKeys:
		return ev.ExtraKeys == nil
	case wireGroupIdx:
		// vLLM sets group_idx on every event that names a cache spec.
		return ev.GroupIdx == 0 && ev.KVCacheSpecKind == "" && ev.SlidingWindow == 0
	case wireSpecKind:
		return ev.KVCacheSpecKind == ""
	case wireSlidingWindow:
		return ev.SlidingWindow == 0
	case wireLocality:
		return ev.Locality == LocalityUnspecified
	case wireOwnership:
		return ev.Ownership == ""
	case wireBlockOffsets:
		return len(ev.BlockOffsets) == 0
	case wireRemainingCopies:
		return len(ev.RemainingCopies) == 0
	case wireCacheSalt:
		return ev.CacheSalt == ""
	case wireMMKeys, wireSessionID, wireEventVersion:
		// Never written: multimodal keys travel as extra keys, and the
		// others are not kept.
		return true
	}
	return false
}

func appendField(e *wireEncoder, ev *Event, f wireField, enc Encoding) error {
	switch f {
	case wireBlockHashes:
		e.do(e.EncodeArrayLen(len(ev.BlockHashes)))
		for _, h := range ev.BlockHashes {
			e.appendUint(h)
		}
	case wireParent:
		if ev.HasParent && ev.ParentHash != 0 {
			e.do(e.EncodeUint(ev.ParentHash))
		} else {
			e.do(e.EncodeNil())
		}
	case wireTokenIDs:
		appendTokens(e, ev)
	case wireBlockSize:
		e.do(e.EncodeInt(int64(ev.BlockSize)))
	case wireLoRAID:
		if ev.HasLoRAID {
			e.do(e.EncodeInt(ev.LoRAID))
		} else {
			e.do(e.EncodeNil())
		}
	case wireMedium:
		e.do(e.EncodeString(ev.Medium.String()))
	case wireLoRAName:
		if ev.CacheSalt != "" && enc == EncodingArray {
			// SGLang's metadata map, in lora_name's place: the one way
			// array form carries a salt outside extra_keys.
			n := 1
			if ev.LoRAName != "" {
				n = 2
			}
			e.do(e.EncodeMapLen(n))
			e.do(e.EncodeString("cache_salt"))
			e.do(e.EncodeString(ev.CacheSalt))
			if ev.LoRAName != "" {
				e.do(e.EncodeString("lora_name"))
				e.do(e.EncodeString(ev.LoRAName))
			}
			break
		}
		appendOptionalString(e, ev.LoRAName)
	case wireExtraKeys:
		if ev.ExtraKeys == nil {
			e.do(e.EncodeNil())
			break
		}
		e.do(e.EncodeArrayLen(len(ev.ExtraKeys)))
		for i, k := range ev.ExtraKeys {
			if k == nil {
				e.do(e.EncodeNil())
				continue
			}
			if err := appendValue(e, []any(k), 0); err != nil {
				return fmt.Errorf("block %d: %w", i, err)
			}
		}
	case wireGroupIdx:
		e.do(e.EncodeInt(int64(ev.GroupIdx)))
	case wireSpecKind:
		appendOptionalString(e, ev.KVCacheSpecKind)
	case wireSlidingWindow:
		e.do(e.EncodeInt(int64(ev.SlidingWindow)))
	case wireLocality:
		appendOptionalString(e, ev.Locality.String())
	case wireOwnership:
		appendOptionalString(e, ev.Ownership)
	case wireBlockOffsets:
		appendInts(e, ev.BlockOffsets)
	case wireRemainingCopies:
		appendInts(e, ev.RemainingCopies)
	case wireCacheSalt:
		appendOptionalString(e, ev.CacheSalt)
	}
	return e.err
}

func appendInts(e *wireEncoder, xs []int32) {
	e.do(e.EncodeArrayLen(len(xs)))
	for _, x := range xs {
		e.do(e.EncodeInt(int64(x)))
	}
}

// appendTokens writes token_ids as the event's publisher did: ints, pairs
// for a bigram event, an empty string where a token was opaque.
func appendTokens(e *wireEncoder, ev *Event) {
	e.do(e.EncodeArrayLen(len(ev.TokenIDs)))
	if ev.Bigram {
		for i, t := range ev.TokenIDs {
			next := ev.BigramNext
			if i+1 < len(ev.TokenIDs) {
				next = ev.TokenIDs[i+1]
			}
			e.do(e.EncodeArrayLen(2))
			e.appendUint(uint64(t))
			e.appendUint(uint64(next))
		}
		return
	}
	opaque := ev.OpaqueTokens
	for i, t := range ev.TokenIDs {
		if len(opaque) > 0 && int(opaque[0]) == i {
			opaque = opaque[1:]
			e.do(e.EncodeString(""))
			continue
		}
		e.appendUint(uint64(t))
	}
}

func appendOptionalString(e *wireEncoder, s string) {
	if s == "" {
		e.do(e.EncodeNil())
		return
	}
	e.do(e.EncodeString(s))
}

// encodeValue writes one element of an extra key: the types the decoder
// produces, and the plain Go ints a caller building a batch would use.
func appendValue(e *wireEncoder, v any, depth int) error {
	if depth > maxWireDepth {
		return errTooDeep
	}
	switch v := v.(type) {
	case nil:
		e.do(e.EncodeNil())
	case bool:
		e.do(e.EncodeBool(v))
	case int:
		e.do(e.EncodeInt(int64(v)))
	case int64:
		e.do(e.EncodeInt(v))
	case uint64:
		e.do(e.EncodeUint(v))
	case float64:
		e.do(e.EncodeFloat64(v))
	case string:
		e.do(e.EncodeString(v))
	case []byte:
		if v == nil {
			v = []byte{}
		}
		e.do(e.EncodeBytes(v))
	case []any:
		e.do(e.EncodeArrayLen(len(v)))
		for _, x := range v {
			if err := appendValue(e, x, depth+1); err != nil {
				return err
			}
		}
	case ExtraKey:
		return appendValue(e, []any(v), depth)
	case map[string]any:
		// Sorted, so that equal batches encode to equal bytes.
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		e.do(e.EncodeMapLen(len(v)))
		for _, k := range keys {
			e.do(e.EncodeString(k))
			if err := appendValue(e, v[k], depth+1); err != nil {
				return err
			}
		}
	default:
		return fmt.Errorf("extra key element of type %T", v)
	}
	return e.err
}
