package events

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// ErrMalformed is wrapped by every error Decode returns: the bytes are not a
// KV-event batch that any vLLM version (or a known compatible publisher)
// writes. The wrapping error says where: which event and which field.
var ErrMalformed = errors.New("malformed kv event batch")

// Causes wrapped together with ErrMalformed.
var (
	errTruncated  = errors.New("data ends inside a value")
	errTooDeep    = errors.New("values nested too deeply")
	errNil        = errors.New("nil where a value is required")
	errOutOfRange = errors.New("integer out of range")
)

const (
	// maxWireDepth bounds the nesting of values the decoder walks generically
	// (unknown fields, extra keys). vLLM nests at most three levels; the
	// bound keeps hostile input from growing the stack without limit.
	maxWireDepth = 32

	// Interned strings (LoRA names, cache-spec kinds) repeat in every event,
	// so the decoder keeps a few to avoid allocating them each time; the
	// bounds keep hostile input from growing the table.
	maxInterned    = 64
	maxInternedLen = 64
)

// Decoder decodes vLLM KV-event batches. Its zero value is ready to use. It
// reuses its internal state between calls, so it is not safe for concurrent
// use; give each goroutine its own.
type Decoder struct {
	// data is the batch being decoded; r reads it and dec walks it. Keeping
	// data lets the decoder look at the next byte and take string views
	// without going through dec, which would allocate.
	data []byte
	r    bytes.Reader
	dec  msgpack.Decoder

	interned map[string]string
	// dropEvent is set while decoding an event that must be skipped even
	// though its tag is known (an unknown medium).
	dropEvent bool
	// ignored counts the current event's fields that are decoded but not
	// acted on; mm holds its multimodal keys until they are merged.
	ignored [NumIgnored]int
	mm      []ExtraKey
}

// Decode decodes one batch as vLLM writes it into b, which it resets first.
// It reuses b's slices, so decoding into the same Batch again allocates
// nothing in the steady state. On error b holds no events and the error
// wraps ErrMalformed.
func (d *Decoder) Decode(data []byte, b *Batch) error {
	b.Reset()
	d.data = data
	d.r.Reset(data)
	d.dec.Reset(&d.r)
	err := d.batch(b)
	if err == nil && d.r.Len() > 0 {
		err = fmt.Errorf("%d bytes after the batch", d.r.Len())
	}
	// Drop the reference so the caller's buffer is not kept alive.
	d.data = nil
	d.r.Reset(nil)
	if err != nil {
		b.Reset()
		return fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	return nil
}

// Decode decodes one batch into a new Batch. A long-lived consumer should
// keep a Decoder and a Batch and call Decoder.Decode instead.
func Decode(data []byte) (*Batch, error) {
	var d Decoder
	b := new(Batch)
	if err := d.Decode(data, b); err != nil {
		return nil, err
	}
	return b, nil
}

func (d *Decoder) batch(b *Batch) error {
	c, err := d.peek()
	if err != nil {
		return fmt.Errorf("envelope: %w", err)
	}
	switch {
	case wireIsArray(c):
		return d.arrayEnvelope(b)
	case wireIsMap(c):
		return d.mapEnvelope(b)
	}
	return fmt.Errorf("envelope: %s where an array or map is expected", wireCodeName(c))
}

// arrayEnvelope reads [ts, events] or [ts, events, data_parallel_rank].
func (d *Decoder) arrayEnvelope(b *Batch) error {
	n, err := d.arrayLen()
	if err != nil {
		return fmt.Errorf("envelope: %w", err)
	}
	if n < 2 {
		return fmt.Errorf("envelope: array of %d elements, want at least 2", n)
	}
	if b.TS, err = d.float(); err != nil {
		return fmt.Errorf("ts: %w", err)
	}
	if err := d.events(b); err != nil {
		return err
	}
	if n >= 3 {
		if err := d.rank(b); err != nil {
			return err
		}
	}
	// Later vLLM may append envelope fields; they are not ours to refuse.
	for i := 3; i < n; i++ {
		if err := d.skip(0); err != nil {
			return fmt.Errorf("envelope element %d: %w", i, err)
		}
	}
	return nil
}

func (d *Decoder) mapEnvelope(b *Batch) error {
	n, err := d.mapLen()
	if err != nil {
		return fmt.Errorf("envelope: %w", err)
	}
	for i := 0; i < n; i++ {
		key, err := d.raw()
		if err != nil {
			return fmt.Errorf("envelope key %d: %w", i, err)
		}
		switch string(key) {
		case "ts":
			if b.TS, err = d.float(); err != nil {
				return fmt.Errorf("ts: %w", err)
			}
		case "events":
			if err := d.events(b); err != nil {
				return err
			}
		case "data_parallel_rank":
			if err := d.rank(b); err != nil {
				return err
			}
		default:
			if err := d.skip(0); err != nil {
				return fmt.Errorf("envelope field %q: %w", key, err)
			}
		}
	}
	return nil
}

func (d *Decoder) rank(b *Batch) error {
	if d.nextIsNil() {
		b.DPRank, b.HasDPRank = 0, false
		return d.dec.DecodeNil()
	}
	r, err := d.smallInt()
	if err != nil {
		return fmt.Errorf("data_parallel_rank: %w", err)
	}
	b.DPRank, b.HasDPRank = r, true
	return nil
}

func (d *Decoder) events(b *Batch) error {
	// A map envelope may name "events" twice; the last one counts.
	b.Events, b.Skipped = b.Events[:0], 0
	n, err := d.arrayLen()
	if err != nil {
		return fmt.Errorf("events: %w", err)
	}
	if n > cap(b.Events) {
		b.Events = slices.Grow(b.Events, n)
	}
	for i := 0; i < n; i++ {
		if err := d.event(b); err != nil {
			return fmt.Errorf("event %d: %w", i, err)
		}
	}
	return nil
}

// event decodes one event onto the end of b.Events, or counts it in
// b.Skipped when it must be left out.
func (d *Decoder) event(b *Batch) error {
	e := nextEvent(b)
	d.dropEvent = false
	d.ignored = [NumIgnored]int{}
	d.mm = d.mm[:0]
	c, err := d.peek()
	if err != nil {
		return err
	}
	known := true
	switch {
	case wireIsArray(c):
		known, err = d.arrayEvent(e)
	case wireIsMap(c):
		known, err = d.mapEvent(e)
	default:
		err = fmt.Errorf("%s where an array or map is expected", wireCodeName(c))
	}
	if err != nil {
		return err
	}
	for i, n := range d.ignored {
		b.Ignored[i] += n
	}
	if !known || d.dropEvent {
		b.Events = b.Events[:len(b.Events)-1]
		b.Skipped++
		return nil
	}
	if len(d.mm) > 0 {
		mergeMMKeys(e, d.mm)
	}
	return nil
}

// nextEvent appends a cleared event to b.Events, reusing the slot's slices
// when an earlier batch left one there.
func nextEvent(b *Batch) *Event {
	if n := len(b.Events); n < cap(b.Events) {
		b.Events = b.Events[:n+1]
		e := &b.Events[n]
		e.reset()
		return e
	}
	b.Events = append(b.Events, Event{})
	return &b.Events[len(b.Events)-1]
}

// wireField names one of an event's fields, in either encoding.
type wireField uint8

const (
	wireUnknown wireField = iota
	wireBlockHashes
	wireParent
	wireTokenIDs
	wireBlockSize
	wireLoRAID
	wireMedium
	wireLoRAName
	wireExtraKeys
	wireGroupIdx
	wireSpecKind
	wireSlidingWindow
	wireLocality
	wireOwnership
	wireBlockOffsets
	wireRemainingCopies
	wireMMKeys
	wireCacheSalt
	wireSessionID
	wireEventVersion
)

var wireNames = [...]string{
	wireUnknown:       "unknown",
	wireBlockHashes:   "block_hashes",
	wireParent:        "parent_block_hash",
	wireTokenIDs:      "token_ids",
	wireBlockSize:     "block_size",
	wireLoRAID:        "lora_id",
	wireMedium:        "medium",
	wireLoRAName:      "lora_name",
	wireExtraKeys:     "extra_keys",
	wireGroupIdx:      "group_idx",
	wireSpecKind:      "kv_cache_spec_kind",
	wireSlidingWindow: "kv_cache_spec_sliding_window",
	wireLocality:      "locality",
	wireOwnership:     "ownership",
	wireBlockOffsets:  "block_offsets",
	// remaining_copy_counts and mm_keys are as vLLM's pending change and
	// TensorRT-LLM name them; cache_salt and session_id as SGLang does.
	wireRemainingCopies: "remaining_copy_counts",
	wireMMKeys:          "mm_keys",
	wireCacheSalt:       "cache_salt",
	wireSessionID:       "session_id",
	wireEventVersion:    "event_version",
}

func (f wireField) String() string { return wireNames[f] }

func wireByName(name []byte) wireField {
	switch string(name) {
	case "block_hashes":
		return wireBlockHashes
	case "parent_block_hash":
		return wireParent
	case "token_ids":
		return wireTokenIDs
	case "block_size":
		return wireBlockSize
	case "lora_id":
		return wireLoRAID
	case "medium":
		return wireMedium
	case "lora_name":
		return wireLoRAName
	case "extra_keys":
		return wireExtraKeys
	case "group_idx":
		return wireGroupIdx
	case "kv_cache_spec_kind":
		return wireSpecKind
	case "kv_cache_spec_sliding_window":
		return wireSlidingWindow
	case "locality":
		return wireLocality
	case "ownership":
		return wireOwnership
	case "block_offsets":
		return wireBlockOffsets
	case "remaining_copy_counts":
		return wireRemainingCopies
	case "mm_keys":
		return wireMMKeys
	case "cache_salt":
		return wireCacheSalt
	case "session_id":
		return wireSessionID
	case "event_version":
		return wireEventVersion
	}
	return wireUnknown
}

// The positional field order of each event in array form (after the tag):
// vLLM's declaration order. vLLM writes map form since it added locality and
// ownership, so their positions only matter to a publisher that keeps the
// array form; the fields of pending changes have no position yet and are
// read by name only.
var (
	storedWireFields = []wireField{
		wireBlockHashes, wireParent, wireTokenIDs, wireBlockSize, wireLoRAID,
		wireMedium, wireLoRAName, wireExtraKeys, wireGroupIdx, wireSpecKind,
		wireSlidingWindow, wireLocality, wireOwnership,
	}
	removedWireFields = []wireField{wireBlockHashes, wireMedium, wireGroupIdx, wireLocality, wireOwnership}

	// The fields each kind may carry by name, beyond its positional ones.
	storedNamedFields  = []wireField{wireBlockOffsets, wireMMKeys, wireCacheSalt, wireSessionID, wireEventVersion}
	removedNamedFields = []wireField{wireRemainingCopies, wireEventVersion}
)

// Fewest positional fields an array event may carry after its tag: the
// oldest vLLM omits everything after block_size of BlockStored, and
// everything after block_hashes of BlockRemoved.
const (
	minStoredFields  = 4
	minRemovedFields = 1
)

func kindByTag(tag []byte) Kind {
	switch string(tag) {
	case "BlockStored":
		return KindBlockStored
	case "BlockRemoved":
		return KindBlockRemoved
	case "AllBlocksCleared":
		return KindAllBlocksCleared
	}
	return 0
}

// fieldsOf returns the fields an event of kind k carries, in array order.
func fieldsOf(k Kind) []wireField {
	switch k {
	case KindBlockStored:
		return storedWireFields
	case KindBlockRemoved:
		return removedWireFields
	}
	return nil
}

// hasField says whether an event of kind k may carry f, by position or name.
func hasField(k Kind, f wireField) bool {
	switch k {
	case KindBlockStored:
		return slices.Contains(storedWireFields, f) || slices.Contains(storedNamedFields, f)
	case KindBlockRemoved:
		return slices.Contains(removedWireFields, f) || slices.Contains(removedNamedFields, f)
	}
	return f == wireEventVersion
}

// arrayEvent decodes [tag, fields...]. known is false for an unknown tag,
// whose fields are skipped.
func (d *Decoder) arrayEvent(e *Event) (known bool, err error) {
	n, err := d.arrayLen()
	if err != nil {
		return false, err
	}
	if n == 0 {
		return false, errors.New("empty event array")
	}
	tag, err := d.raw()
	if err != nil {
		return false, fmt.Errorf("tag: %w", err)
	}
	e.Kind = kindByTag(tag)
	if e.Kind == 0 {
		for i := 1; i < n; i++ {
			if err := d.skip(0); err != nil {
				return false, fmt.Errorf("%q element %d: %w", tag, i, err)
			}
		}
		return false, nil
	}
	fields := fieldsOf(e.Kind)
	switch {
	case e.Kind == KindBlockStored && n-1 < minStoredFields,
		e.Kind == KindBlockRemoved && n-1 < minRemovedFields:
		return false, fmt.Errorf("%s array of %d elements is too short", e.Kind, n)
	}
	for i := 1; i < n; i++ {
		if i-1 >= len(fields) {
			// A field from a vLLM newer than this decoder.
			d.ignored[IgnoredUnknown]++
			if err := d.skip(0); err != nil {
				return false, fmt.Errorf("%s element %d: %w", e.Kind, i, err)
			}
			continue
		}
		f := fields[i-1]
		if err := d.decodeField(e, f); err != nil {
			return false, fmt.Errorf("%s %s: %w", e.Kind, f, err)
		}
	}
	return true, d.checkEvent(e)
}

// checkEvent checks what one field cannot check alone: that the lists
// aligned with block_hashes have its length, and that a sparse store's
// offsets name chunks its tokens have, in order.
func (d *Decoder) checkEvent(e *Event) error {
	if n := len(e.RemainingCopies); n > 0 && n != len(e.BlockHashes) {
		return fmt.Errorf("%s has %d remaining_copy_counts for %d block_hashes", e.Kind, n, len(e.BlockHashes))
	}
	if n := len(e.BlockOffsets); n > 0 {
		if n != len(e.BlockHashes) {
			return fmt.Errorf("%s has %d block_offsets for %d block_hashes", e.Kind, n, len(e.BlockHashes))
		}
		prev := int32(-1)
		for i, o := range e.BlockOffsets {
			if o <= prev {
				return fmt.Errorf("%s block_offsets[%d] = %d after %d: offsets must increase", e.Kind, i, o, prev)
			}
			prev = o
		}
	}
	return nil
}

// mapEvent decodes {"type": tag, name: value, ...}. vLLM writes the tag
// first; other publishers may not, so when it is not first the map is
// scanned for it and then decoded again from the start.
func (d *Decoder) mapEvent(e *Event) (known bool, err error) {
	start := d.pos()
	n, err := d.mapLen()
	if err != nil {
		return false, err
	}
	var tag []byte
	pairs := n
	if n > 0 {
		key, err := d.raw()
		if err != nil {
			return false, fmt.Errorf("key 0: %w", err)
		}
		if string(key) == "type" {
			if tag, err = d.raw(); err != nil {
				return false, fmt.Errorf("type: %w", err)
			}
			pairs = n - 1
		} else {
			d.seek(start)
			if tag, err = d.findType(); err != nil {
				return false, err
			}
			d.seek(start)
			if _, err := d.mapLen(); err != nil {
				return false, err
			}
		}
	}
	if tag == nil {
		return false, errors.New(`event map has no "type"`)
	}
	e.Kind = kindByTag(tag)
	if e.Kind == 0 {
		d.seek(start)
		if err := d.skip(0); err != nil {
			return false, fmt.Errorf("%q: %w", tag, err)
		}
		return false, nil
	}
	fields := fieldsOf(e.Kind)
	sawHashes := false
	for i := 0; i < pairs; i++ {
		key, err := d.raw()
		if err != nil {
			return false, fmt.Errorf("%s key: %w", e.Kind, err)
		}
		f := wireByName(key)
		if f == wireUnknown || !hasField(e.Kind, f) {
			// "type" again (when it was not first), or a field this kind
			// does not have, or one from a newer vLLM.
			if string(key) != "type" {
				d.ignored[IgnoredUnknown]++
			}
			if err := d.skip(0); err != nil {
				return false, fmt.Errorf("%s %q: %w", e.Kind, key, err)
			}
			continue
		}
		sawHashes = sawHashes || f == wireBlockHashes
		if err := d.decodeField(e, f); err != nil {
			return false, fmt.Errorf("%s %s: %w", e.Kind, f, err)
		}
	}
	if len(fields) > 0 && !sawHashes {
		return false, fmt.Errorf("%s has no block_hashes", e.Kind)
	}
	return true, d.checkEvent(e)
}

// findType reads a whole event map and returns the value under "type", or
// nil when there is none.
func (d *Decoder) findType() ([]byte, error) {
	n, err := d.mapLen()
	if err != nil {
		return nil, err
	}
	var tag []byte
	for i := 0; i < n; i++ {
		key, err := d.raw()
		if err != nil {
			return nil, fmt.Errorf("key %d: %w", i, err)
		}
		if string(key) == "type" {
			if tag, err = d.raw(); err != nil {
				return nil, fmt.Errorf("type: %w", err)
			}
			continue
		}
		if err := d.skip(0); err != nil {
			return nil, fmt.Errorf("%q: %w", key, err)
		}
	}
	return tag, nil
}

// decodeField decodes one field's value into e. A nil value means the field's
// default, as msgspec writes None.
func (d *Decoder) decodeField(e *Event, f wireField) error {
	var err error
	switch f {
	case wireBlockHashes:
		e.BlockHashes, err = d.hashes(e.BlockHashes[:0])
	case wireParent:
		e.ParentHash, e.HasParent = 0, false
		if d.nextIsNil() {
			return d.dec.DecodeNil()
		}
		if e.ParentHash, err = d.hash(); err == nil {
			// Some publishers write 0 rather than nil for "no parent".
			e.HasParent = e.ParentHash != 0
		}
	case wireTokenIDs:
		err = d.tokenField(e)
	case wireBlockSize:
		e.BlockSize, err = d.optionalSmallInt()
	case wireLoRAID:
		e.LoRAID, e.HasLoRAID = 0, false
		if d.nextIsNil() {
			return d.dec.DecodeNil()
		}
		if e.LoRAID, err = d.int64(); err == nil {
			e.HasLoRAID = true
		}
	case wireMedium:
		err = d.medium(e)
	case wireLoRAName:
		err = d.loraName(e)
	case wireExtraKeys:
		e.ExtraKeys, err = d.extraKeys()
	case wireGroupIdx:
		e.GroupIdx, err = d.optionalSmallInt()
	case wireSpecKind:
		e.KVCacheSpecKind, err = d.optionalString()
	case wireSlidingWindow:
		e.SlidingWindow, err = d.optionalSmallInt()
	case wireLocality, wireOwnership:
		// Descriptive fields: a shape other than a string is not worth
		// refusing the batch for, only counting.
		if c, _ := d.peek(); c != msgpcode.Nil && !wireIsStr(c) && !wireIsBin(c) {
			d.ignored[IgnoredUnknown]++
			return d.skip(0)
		}
		var s []byte
		if s, err = d.optionalRaw(); err != nil || s == nil {
			return err
		}
		if f == wireLocality {
			e.Locality = parseLocality(s)
			d.ignored[IgnoredLocality]++
		} else {
			e.Ownership = d.intern(s)
			d.ignored[IgnoredOwnership]++
		}
	case wireBlockOffsets:
		e.BlockOffsets, err = d.smallInts(e.BlockOffsets[:0])
	case wireRemainingCopies:
		e.RemainingCopies, err = d.smallInts(e.RemainingCopies[:0])
	case wireMMKeys:
		d.mm, err = d.mmKeys(d.mm[:0])
	case wireCacheSalt:
		e.CacheSalt, err = d.optionalString()
	case wireSessionID, wireEventVersion:
		if !d.nextIsNil() {
			if f == wireSessionID {
				d.ignored[IgnoredSessionID]++
			} else {
				d.ignored[IgnoredEventVersion]++
			}
		}
		err = d.skip(0)
	default:
		err = d.skip(0)
	}
	return err
}

// loraName reads the field after medium in array form: vLLM's lora_name, a
// string or nil, or SGLang's metadata map in the same place (cache_salt,
// session_id, and the adapter's name when it has one).
func (d *Decoder) loraName(e *Event) error {
	c, err := d.peek()
	if err != nil {
		return err
	}
	if !wireIsMap(c) {
		e.LoRAName, err = d.optionalString()
		return err
	}
	n, err := d.mapLen()
	if err != nil {
		return err
	}
	for i := 0; i < n; i++ {
		key, err := d.raw()
		if err != nil {
			return fmt.Errorf("metadata key %d: %w", i, err)
		}
		switch string(key) {
		case "cache_salt":
			e.CacheSalt, err = d.optionalString()
		case "lora_name":
			e.LoRAName, err = d.optionalString()
		case "session_id":
			d.ignored[IgnoredSessionID]++
			err = d.skip(0)
		default:
			d.ignored[IgnoredUnknown]++
			err = d.skip(0)
		}
		if err != nil {
			return fmt.Errorf("metadata %q: %w", key, err)
		}
	}
	return nil
}

// smallInts reads a nil-or-array of counts or indexes.
func (d *Decoder) smallInts(dst []int32) ([]int32, error) {
	if d.nextIsNil() {
		return dst, d.dec.DecodeNil()
	}
	n, err := d.arrayLen()
	if err != nil {
		return dst, err
	}
	dst = slices.Grow(dst, n)
	for i := 0; i < n; i++ {
		v, err := d.smallInt()
		if err != nil {
			return dst, fmt.Errorf("element %d: %w", i, err)
		}
		dst = append(dst, int32(v))
	}
	return dst, nil
}

// mmKeys reads TensorRT-LLM's per-block multimodal keys: for each block nil
// or a list of {"hash", "start_offset", "uuid"} maps. Each becomes an
// ("mm_key", hash, start_offset, uuid) tuple, merged into the block's extra
// keys once the event is read, so that it marks the block as vLLM's own
// multimodal extras do.
func (d *Decoder) mmKeys(dst []ExtraKey) ([]ExtraKey, error) {
	if d.nextIsNil() {
		return dst, d.dec.DecodeNil()
	}
	n, err := d.arrayLen()
	if err != nil {
		return dst, err
	}
	for i := 0; i < n; i++ {
		v, err := d.value(0)
		if err != nil {
			return dst, fmt.Errorf("block %d: %w", i, err)
		}
		var block ExtraKey
		switch v := v.(type) {
		case nil:
		case []any:
			for _, k := range v {
				m, ok := k.(map[string]any)
				if !ok {
					return dst, fmt.Errorf("block %d: an mm key is %T, want a map", i, k)
				}
				block = append(block, []any{"mm_key", m["hash"], m["start_offset"], m["uuid"]})
			}
		default:
			return dst, fmt.Errorf("block %d: %T where a list of mm keys or nil is expected", i, v)
		}
		dst = append(dst, block)
	}
	return dst, nil
}

// mergeMMKeys appends the event's multimodal keys to its extra keys.
func mergeMMKeys(e *Event, mm []ExtraKey) {
	for i, k := range mm {
		if len(k) == 0 {
			continue
		}
		for len(e.ExtraKeys) <= i {
			e.ExtraKeys = append(e.ExtraKeys, nil)
		}
		e.ExtraKeys[i] = append(slices.Clip(e.ExtraKeys[i]), k...)
	}
}

func (d *Decoder) medium(e *Event) error {
	e.Medium = TierGPU
	if d.nextIsNil() {
		return d.dec.DecodeNil()
	}
	s, err := d.raw()
	if err != nil {
		return err
	}
	switch string(s) {
	case "GPU":
		e.Medium = TierGPU
	case "CPU":
		e.Medium = TierCPU
	case "STORAGE":
		e.Medium = TierStorage
	default:
		t, ok := tierOfMedium(s)
		if !ok {
			// A tier this project does not know: the event cannot be
			// placed, so it is left out (and counted) rather than guessed.
			d.dropEvent = true
			return nil
		}
		e.Medium = t
	}
	return nil
}

// tierOfMedium maps the media publishers name onto tiers: vLLM's GPU, CPU
// and STORAGE in any case, vLLM 0.26's FS and OBJ (its storage tiers before
// they became STORAGE), and SGLang's hierarchical-cache CPU_TIER1 (host
// memory) and CPU_TIER2 (its storage backend).
func tierOfMedium(s []byte) (Tier, bool) {
	if t, err := ParseTier(string(s)); err == nil {
		return t, true
	}
	switch {
	case bytes.EqualFold(s, []byte("CPU_TIER1")):
		return TierCPU, true
	case bytes.EqualFold(s, []byte("CPU_TIER2")), bytes.EqualFold(s, []byte("FS")), bytes.EqualFold(s, []byte("OBJ")):
		return TierStorage, true
	}
	return 0, false
}

func (d *Decoder) hashes(dst []uint64) ([]uint64, error) {
	n, err := d.arrayLen()
	if err != nil || n == 0 {
		return dst, err
	}
	dst = slices.Grow(dst, n)
	for i := 0; i < n; i++ {
		h, err := d.hash()
		if err != nil {
			return dst, fmt.Errorf("hash %d: %w", i, err)
		}
		dst = append(dst, h)
	}
	return dst, nil
}

// hash reads a block hash: an int of any width (a negative one keeps its
// two's-complement bits) or a byte string whose last 8 bytes, big-endian,
// are the hash.
func (d *Decoder) hash() (uint64, error) {
	p := d.pos()
	if v, _, size := intAt(d.data, p); size > 0 {
		d.seek(p + size)
		return v, nil
	}
	c, err := d.peek()
	if err != nil {
		return 0, err
	}
	switch {
	case wireIsStr(c) || wireIsBin(c):
		b, err := d.raw()
		if err != nil {
			return 0, err
		}
		if len(b) < 8 {
			return 0, fmt.Errorf("byte-string hash of %d bytes, want at least 8", len(b))
		}
		return binary.BigEndian.Uint64(b[len(b)-8:]), nil
	case c == msgpcode.Nil:
		return 0, errNil
	case wireIsInt(c):
		return 0, errTruncated
	}
	return 0, fmt.Errorf("%s where a hash is expected", wireCodeName(c))
}

// tokenField reads token_ids in any of the shapes publishers send: a list
// of ints (vLLM), a list of [token, next token] pairs (SGLang with EAGLE),
// or a list of ints with strings in place of multimodal tokens
// (TensorRT-LLM).
func (d *Decoder) tokenField(e *Event) error {
	e.Bigram, e.BigramNext = false, 0
	e.OpaqueTokens = e.OpaqueTokens[:0]
	n, err := d.arrayLen()
	if err != nil || n == 0 {
		e.TokenIDs = e.TokenIDs[:0]
		return err
	}
	if c, err := d.peek(); err == nil && wireIsArray(c) {
		return d.bigramTokens(e, n)
	}
	e.TokenIDs, err = d.tokens(e, e.TokenIDs[:0], n)
	return err
}

// tokens reads n token ids. They are most of a batch's bytes, so the loop
// reads them straight from the input and moves the reader once at the end.
func (d *Decoder) tokens(e *Event, dst []uint32, n int) ([]uint32, error) {
	dst = slices.Grow(dst, n)
	p := d.pos()
	defer func() { d.seek(p) }()
	for i := 0; i < n; i++ {
		v, neg, size := intAt(d.data, p)
		if size == 0 {
			if p < len(d.data) && wireIsStr(d.data[p]) {
				// Not a token id: the block holding it can match nothing.
				d.seek(p)
				if _, err := d.raw(); err != nil {
					return dst, fmt.Errorf("token %d: %w", i, err)
				}
				p = d.pos()
				e.OpaqueTokens = append(e.OpaqueTokens, int32(i))
				dst = append(dst, 0)
				continue
			}
			if p >= len(d.data) || wireIsInt(d.data[p]) {
				return dst, fmt.Errorf("token %d: %w", i, errTruncated)
			}
			return dst, fmt.Errorf("token %d: %s where an int is expected", i, wireCodeName(d.data[p]))
		}
		if neg || v > math.MaxUint32 {
			return dst, fmt.Errorf("token %d: %w: %d", i, errOutOfRange, int64(v))
		}
		dst = append(dst, uint32(v))
		p += size
	}
	return dst, nil
}

// bigramTokens reads n [token, next] pairs, each pair's first token the
// previous pair's second, into the first tokens and the last next token.
func (d *Decoder) bigramTokens(e *Event, n int) error {
	dst := slices.Grow(e.TokenIDs[:0], n)
	var pair [2]uint32
	for i := 0; i < n; i++ {
		m, err := d.arrayLen()
		if err != nil {
			return fmt.Errorf("token pair %d: %w", i, err)
		}
		if m != 2 {
			return fmt.Errorf("token pair %d has %d elements, want 2", i, m)
		}
		for j := range pair {
			v, err := d.int64()
			if err != nil {
				return fmt.Errorf("token pair %d: %w", i, err)
			}
			if v < 0 || v > math.MaxUint32 {
				return fmt.Errorf("token pair %d: %w: %d", i, errOutOfRange, v)
			}
			pair[j] = uint32(v)
		}
		if i > 0 && pair[0] != e.BigramNext {
			return fmt.Errorf("token pair %d starts with %d, not the previous pair's %d", i, pair[0], e.BigramNext)
		}
		dst = append(dst, pair[0])
		e.BigramNext = pair[1]
	}
	e.TokenIDs, e.Bigram = dst, true
	return nil
}

// intAt reads the msgpack int at data[p:] without going through the
// Decoder. It returns the value's two's-complement bits, whether it is
// negative, and its encoded size; size is 0 when no whole int is there.
func intAt(data []byte, p int) (v uint64, neg bool, size int) {
	if p >= len(data) {
		return 0, false, 0
	}
	c := data[p]
	switch {
	case c <= msgpcode.PosFixedNumHigh:
		return uint64(c), false, 1
	case c >= msgpcode.NegFixedNumLow:
		return uint64(int64(int8(c))), true, 1
	}
	b := data[p+1:]
	switch c {
	case msgpcode.Uint8:
		if len(b) >= 1 {
			return uint64(b[0]), false, 2
		}
	case msgpcode.Uint16:
		if len(b) >= 2 {
			return uint64(binary.BigEndian.Uint16(b)), false, 3
		}
	case msgpcode.Uint32:
		if len(b) >= 4 {
			return uint64(binary.BigEndian.Uint32(b)), false, 5
		}
	case msgpcode.Uint64:
		if len(b) >= 8 {
			return binary.BigEndian.Uint64(b), false, 9
		}
	case msgpcode.Int8:
		if len(b) >= 1 {
			x := int64(int8(b[0]))
			return uint64(x), x < 0, 2
		}
	case msgpcode.Int16:
		if len(b) >= 2 {
			x := int64(int16(binary.BigEndian.Uint16(b)))
			return uint64(x), x < 0, 3
		}
	case msgpcode.Int32:
		if len(b) >= 4 {
			x := int64(int32(binary.BigEndian.Uint32(b)))
			return uint64(x), x < 0, 5
		}
	case msgpcode.Int64:
		if len(b) >= 8 {
			x := int64(binary.BigEndian.Uint64(b))
			return uint64(x), x < 0, 9
		}
	}
	return 0, false, 0
}

// extraKeys reads the per-block extras. A list whose entries are all nil
// carries nothing, and becomes nil rather than a slice of nils, so that the
// common case allocates nothing.
func (d *Decoder) extraKeys() ([]ExtraKey, error) {
	n, err := d.arrayLen()
	if err != nil || n <= 0 {
		return nil, err
	}
	var keys []ExtraKey
	for i := 0; i < n; i++ {
		c, err := d.peek()
		if err != nil {
			return nil, fmt.Errorf("block %d: %w", i, err)
		}
		if c == msgpcode.Nil {
			if err := d.dec.DecodeNil(); err != nil {
				return nil, err
			}
			if keys != nil {
				keys = append(keys, nil)
			}
			continue
		}
		if !wireIsArray(c) {
			return nil, fmt.Errorf("block %d: %s where a tuple or nil is expected", i, wireCodeName(c))
		}
		v, err := d.value(0)
		if err != nil {
			return nil, fmt.Errorf("block %d: %w", i, err)
		}
		if keys == nil {
			keys = make([]ExtraKey, i, n)
		}
		keys = append(keys, ExtraKey(v.([]any)))
	}
	return keys, nil
}

// value decodes any value generically, for extra keys. Ints become int64,
// or uint64 above MaxInt64; floats float64; strings string; byte strings
// []byte; arrays []any; maps with string keys map[string]any.
func (d *Decoder) value(depth int) (any, error) {
	if depth > maxWireDepth {
		return nil, errTooDeep
	}
	c, err := d.peek()
	if err != nil {
		return nil, err
	}
	switch {
	case c == msgpcode.Nil:
		return nil, d.dec.DecodeNil()
	case c == msgpcode.False || c == msgpcode.True:
		return d.dec.DecodeBool()
	case c == msgpcode.Uint64:
		u, err := d.dec.DecodeUint64()
		if err != nil || u > math.MaxInt64 {
			return u, err
		}
		return int64(u), nil
	case wireIsInt(c):
		return d.dec.DecodeInt64()
	case c == msgpcode.Float || c == msgpcode.Double:
		return d.dec.DecodeFloat64()
	case wireIsStr(c):
		b, err := d.raw()
		return string(b), err
	case wireIsBin(c):
		b, err := d.raw()
		return bytes.Clone(b), err
	case wireIsArray(c):
		n, err := d.arrayLen()
		if err != nil {
			return nil, err
		}
		s := make([]any, 0, n)
		for i := 0; i < n; i++ {
			v, err := d.value(depth + 1)
			if err != nil {
				return nil, err
			}
			s = append(s, v)
		}
		return s, nil
	case wireIsMap(c):
		n, err := d.mapLen()
		if err != nil {
			return nil, err
		}
		m := make(map[string]any, n)
		for i := 0; i < n; i++ {
			kc, err := d.peek()
			if err != nil {
				return nil, err
			}
			if !wireIsStr(kc) {
				return nil, fmt.Errorf("map key is %s, not a string", wireCodeName(kc))
			}
			k, err := d.raw()
			if err != nil {
				return nil, err
			}
			v, err := d.value(depth + 1)
			if err != nil {
				return nil, err
			}
			m[string(k)] = v
		}
		return m, nil
	}
	return nil, fmt.Errorf("unsupported %s", wireCodeName(c))
}

// skip passes over one value of any shape, bounding its nesting.
func (d *Decoder) skip(depth int) error {
	if depth > maxWireDepth {
		return errTooDeep
	}
	c, err := d.peek()
	if err != nil {
		return err
	}
	switch {
	case wireIsArray(c):
		n, err := d.arrayLen()
		if err != nil {
			return err
		}
		for i := 0; i < n; i++ {
			if err := d.skip(depth + 1); err != nil {
				return err
			}
		}
		return nil
	case wireIsMap(c):
		n, err := d.mapLen()
		if err != nil {
			return err
		}
		for i := 0; i < 2*n; i++ {
			if err := d.skip(depth + 1); err != nil {
				return err
			}
		}
		return nil
	case wireIsStr(c) || wireIsBin(c):
		_, err := d.raw()
		return err
	case wireIsExt(c):
		return d.skipExt(c)
	}
	// Scalars: the library knows their sizes and rejects unused codes.
	return d.dec.Skip()
}

// skipExt passes over an extension value, checking its length against the
// data left before moving, so a hostile length allocates nothing.
func (d *Decoder) skipExt(c byte) error {
	var head, size int
	switch c {
	case msgpcode.FixExt1:
		head, size = 2, 1
	case msgpcode.FixExt2:
		head, size = 2, 2
	case msgpcode.FixExt4:
		head, size = 2, 4
	case msgpcode.FixExt8:
		head, size = 2, 8
	case msgpcode.FixExt16:
		head, size = 2, 16
	case msgpcode.Ext8, msgpcode.Ext16, msgpcode.Ext32:
		rest := d.data[d.pos()+1:]
		switch {
		case c == msgpcode.Ext8 && len(rest) >= 1:
			head, size = 3, int(rest[0])
		case c == msgpcode.Ext16 && len(rest) >= 2:
			head, size = 4, int(binary.BigEndian.Uint16(rest))
		case c == msgpcode.Ext32 && len(rest) >= 4:
			head, size = 6, int(binary.BigEndian.Uint32(rest))
		default:
			return errTruncated
		}
	}
	if head+size > d.r.Len() {
		return errTruncated
	}
	d.seek(d.pos() + head + size)
	return nil
}

// raw reads a str or bin value and returns a view of its bytes in the
// input; it allocates nothing, and the view is valid only during Decode.
func (d *Decoder) raw() ([]byte, error) {
	c, err := d.peek()
	if err != nil {
		return nil, err
	}
	if c == msgpcode.Nil {
		return nil, errNil
	}
	if !wireIsStr(c) && !wireIsBin(c) {
		return nil, fmt.Errorf("%s where a string is expected", wireCodeName(c))
	}
	n, err := d.dec.DecodeBytesLen()
	if err != nil {
		return nil, err
	}
	if n > d.r.Len() {
		return nil, errTruncated
	}
	p := d.pos()
	d.seek(p + n)
	return d.data[p : p+n : p+n], nil
}

// optionalString reads a nil-or-string field; nil is "".
func (d *Decoder) optionalString() (string, error) {
	if d.nextIsNil() {
		return "", d.dec.DecodeNil()
	}
	b, err := d.raw()
	if err != nil {
		return "", err
	}
	return d.intern(b), nil
}

// optionalRaw reads a nil-or-string field as a view of its bytes; nil is nil.
func (d *Decoder) optionalRaw() ([]byte, error) {
	if d.nextIsNil() {
		return nil, d.dec.DecodeNil()
	}
	return d.raw()
}

func (d *Decoder) intern(b []byte) string {
	if s, ok := d.interned[string(b)]; ok {
		return s
	}
	s := string(b)
	if len(b) <= maxInternedLen && len(d.interned) < maxInterned {
		if d.interned == nil {
			d.interned = make(map[string]string)
		}
		d.interned[s] = s
	}
	return s
}

// arrayLen reads an array header. nil counts as empty. A length that the
// remaining data cannot hold (each element takes at least a byte) is
// refused before anyone sizes a slice by it.
func (d *Decoder) arrayLen() (int, error) {
	c, err := d.peek()
	if err != nil {
		return 0, err
	}
	if !wireIsArray(c) && c != msgpcode.Nil {
		return 0, fmt.Errorf("%s where an array is expected", wireCodeName(c))
	}
	n, err := d.dec.DecodeArrayLen()
	if err != nil {
		return 0, err
	}
	if n > d.r.Len() {
		return 0, fmt.Errorf("array of %d elements in %d bytes: %w", n, d.r.Len(), errTruncated)
	}
	return max(n, 0), nil
}

// mapLen is arrayLen for maps; each entry takes at least two bytes.
func (d *Decoder) mapLen() (int, error) {
	c, err := d.peek()
	if err != nil {
		return 0, err
	}
	if !wireIsMap(c) {
		return 0, fmt.Errorf("%s where a map is expected", wireCodeName(c))
	}
	n, err := d.dec.DecodeMapLen()
	if err != nil {
		return 0, err
	}
	if n > d.r.Len()/2 {
		return 0, fmt.Errorf("map of %d entries in %d bytes: %w", n, d.r.Len(), errTruncated)
	}
	return n, nil
}

// float reads a timestamp: a float of either width, or an int from
// publishers that write whole seconds. nil is 0.
func (d *Decoder) float() (float64, error) {
	c, err := d.peek()
	if err != nil {
		return 0, err
	}
	if c != msgpcode.Float && c != msgpcode.Double && !wireIsInt(c) && c != msgpcode.Nil {
		return 0, fmt.Errorf("%s where a number is expected", wireCodeName(c))
	}
	return d.dec.DecodeFloat64()
}

func (d *Decoder) int64() (int64, error) {
	c, err := d.peek()
	if err != nil {
		return 0, err
	}
	if !wireIsInt(c) {
		return 0, fmt.Errorf("%s where an int is expected", wireCodeName(c))
	}
	if c == msgpcode.Uint64 {
		u, err := d.dec.DecodeUint64()
		if err == nil && u > math.MaxInt64 {
			err = fmt.Errorf("%w: %d", errOutOfRange, u)
		}
		return int64(u), err
	}
	return d.dec.DecodeInt64()
}

// smallInt reads a count or index: an int in [0, MaxInt32].
func (d *Decoder) smallInt() (int, error) {
	v, err := d.int64()
	if err != nil {
		return 0, err
	}
	if v < 0 || v > math.MaxInt32 {
		return 0, fmt.Errorf("%w: %d", errOutOfRange, v)
	}
	return int(v), nil
}

func (d *Decoder) optionalSmallInt() (int, error) {
	if d.nextIsNil() {
		return 0, d.dec.DecodeNil()
	}
	return d.smallInt()
}

// pos is the offset of the next unread byte; the msgpack decoder reads
// straight from d.r (a bytes.Reader needs no buffering), so this is exact.
func (d *Decoder) pos() int { return len(d.data) - d.r.Len() }

func (d *Decoder) seek(p int) { _, _ = d.r.Seek(int64(p), io.SeekStart) }

func (d *Decoder) peek() (byte, error) {
	p := d.pos()
	if p >= len(d.data) {
		return 0, errTruncated
	}
	return d.data[p], nil
}

func (d *Decoder) nextIsNil() bool {
	c, err := d.peek()
	return err == nil && c == msgpcode.Nil
}

func wireIsInt(c byte) bool {
	return msgpcode.IsFixedNum(c) || (c >= msgpcode.Uint8 && c <= msgpcode.Int64)
}

func wireIsStr(c byte) bool {
	return msgpcode.IsFixedString(c) || c == msgpcode.Str8 || c == msgpcode.Str16 || c == msgpcode.Str32
}

func wireIsBin(c byte) bool { return c == msgpcode.Bin8 || c == msgpcode.Bin16 || c == msgpcode.Bin32 }

func wireIsArray(c byte) bool {
	return msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32
}

func wireIsMap(c byte) bool {
	return msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32
}

func wireIsExt(c byte) bool {
	return (c >= msgpcode.FixExt1 && c <= msgpcode.FixExt16) ||
		c == msgpcode.Ext8 || c == msgpcode.Ext16 || c == msgpcode.Ext32
}

// codeName names a msgpack type code for error messages.
func wireCodeName(c byte) string {
	switch {
	case c == msgpcode.Nil:
		return "nil"
	case c == msgpcode.False || c == msgpcode.True:
		return "bool"
	case wireIsInt(c):
		return "int"
	case c == msgpcode.Float || c == msgpcode.Double:
		return "float"
	case wireIsStr(c):
		return "string"
	case wireIsBin(c):
		return "bytes"
	case wireIsArray(c):
		return "array"
	case wireIsMap(c):
		return "map"
	case wireIsExt(c):
		return "extension"
	}
	return fmt.Sprintf("unused code 0x%02x", c)
}
