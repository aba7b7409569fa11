// Package events is the vocabulary of KV-cache events that every stage
// shares: the batch and event types, vLLM's msgpack wire format (decoder and
// encoder), and the NATS contract that carries batches from the relay (or the
// simulator) to the EPP: subjects, headers, the JetStream stream, and the
// publisher.
package events

import (
	"fmt"
	"strings"
)

// Tier is the cache tier a block lives in, from vLLM's `medium` field.
type Tier uint8

// The tiers vLLM names. A nil medium means GPU.
const (
	TierGPU Tier = iota
	TierCPU
	TierStorage

	// NumTiers is the number of known tiers; arrays indexed by Tier use it.
	NumTiers = 3
)

// String returns the tier's name as vLLM writes it.
func (t Tier) String() string {
	switch t {
	case TierGPU:
		return "GPU"
	case TierCPU:
		return "CPU"
	case TierStorage:
		return "STORAGE"
	}
	return fmt.Sprintf("Tier(%d)", uint8(t))
}

// MarshalText writes the tier's name, so JSON shows "GPU" rather than 0.
func (t Tier) MarshalText() ([]byte, error) { return []byte(t.String()), nil }

// UnmarshalText reads a tier name, case-insensitively.
func (t *Tier) UnmarshalText(b []byte) error {
	v, err := ParseTier(string(b))
	if err != nil {
		return err
	}
	*t = v
	return nil
}

// ErrUnknownTier is returned for a medium that names no known tier.
var ErrUnknownTier = fmt.Errorf("unknown cache tier")

// ParseTier normalises vLLM's medium string: GPU, CPU or STORAGE, in any case.
// The empty string means GPU, as a nil medium does.
func ParseTier(medium string) (Tier, error) {
	switch {
	case medium == "", strings.EqualFold(medium, "GPU"):
		return TierGPU, nil
	case strings.EqualFold(medium, "CPU"):
		return TierCPU, nil
	case strings.EqualFold(medium, "STORAGE"):
		return TierStorage, nil
	}
	return 0, fmt.Errorf("%w %q", ErrUnknownTier, medium)
}

// Kind says which of vLLM's event types an Event is.
type Kind uint8

// The event kinds vLLM publishes.
const (
	KindBlockStored Kind = iota + 1
	KindBlockRemoved
	KindAllBlocksCleared
)

// String returns the event's tag as vLLM writes it.
func (k Kind) String() string {
	switch k {
	case KindBlockStored:
		return "BlockStored"
	case KindBlockRemoved:
		return "BlockRemoved"
	case KindAllBlocksCleared:
		return "AllBlocksCleared"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// MarshalText writes the event's tag.
func (k Kind) MarshalText() ([]byte, error) { return []byte(k.String()), nil }

// UnmarshalText reads an event's tag as vLLM writes it, so a Batch read
// back from JSON (golden vectors, tooling) keeps its kinds.
func (k *Kind) UnmarshalText(b []byte) error {
	if v := kindByTag(b); v != 0 {
		*k = v
		return nil
	}
	return fmt.Errorf("unknown event kind %q", b)
}

// Event is one KV-cache event. It is a tagged union rather than an interface
// so that a batch decodes into reused slices without an allocation per event;
// Kind says which fields are meaningful.
type Event struct {
	Kind Kind

	// BlockHashes are vLLM's hashes of the blocks stored or removed, reduced to
	// 64 bits (the last 8 bytes, big-endian, for byte-string hashes). They are
	// opaque per-engine handles, not portable keys. BlockStored, BlockRemoved.
	BlockHashes []uint64

	// ParentHash is the hash of the block before the first stored one;
	// HasParent is false when the stored run starts at block 0 (nil, or a zero
	// parent from publishers that write 0 for none). BlockStored.
	ParentHash uint64
	HasParent  bool

	// TokenIDs are the tokens of all stored blocks, BlockSize per block on the
	// normal GPU path; empty for placeholder stores (CPU offload). BlockStored.
	TokenIDs  []uint32
	BlockSize int

	// LoRAID is vLLM's deprecated integer adapter id; HasLoRAID is false when nil.
	LoRAID    int64
	HasLoRAID bool
	// LoRAName identifies the LoRA adapter; empty for the base model.
	LoRAName string

	// Medium is the cache tier (BlockStored, BlockRemoved).
	Medium Tier

	// ExtraKeys are the per-block extras vLLM folds into its hash (LoRA name,
	// multimodal hashes, cache salt, prompt-embedding digests), one entry per
	// block, nil where the block has none. Nil when the event carries none.
	ExtraKeys []ExtraKey

	// GroupIdx is the KV-cache group of a hybrid model (0 otherwise).
	GroupIdx int
	// KVCacheSpecKind is e.g. "full_attention" or "sliding_window"; empty when absent.
	KVCacheSpecKind string
	// SlidingWindow is the sliding-window size for such groups, 0 when absent.
	SlidingWindow int

	// BlockOffsets, when set, says which block-sized chunk of TokenIDs each
	// of BlockHashes is: a sparse store (a Mamba group in align mode, or a
	// masked sliding-window group) names only some of the chunks its tokens
	// cover. Nil for a dense store, where hash i is chunk i. BlockStored.
	BlockOffsets []int32

	// RemainingCopies, when set, is aligned with BlockHashes of a
	// BlockRemoved: how many physical copies of each hash the engine still
	// holds after the removal. Nil when the publisher does not say.
	RemainingCopies []int32

	// Bigram is set when the publisher sent token_ids as pairs of adjacent
	// tokens (SGLang with EAGLE speculative decoding): TokenIDs then holds
	// the first token of each pair, and BigramNext the second token of the
	// last pair, so a block's key covers one token past the block.
	Bigram     bool
	BigramNext uint32

	// OpaqueTokens lists the positions in TokenIDs where the publisher sent
	// something other than a token id (TensorRT-LLM writes multimodal
	// placeholders as strings); TokenIDs holds 0 there. A block containing
	// one can never match a request's tokens.
	OpaqueTokens []int32

	// CacheSalt is the salt the publisher names apart from extra_keys
	// (SGLang's BlockStored metadata); empty when absent.
	CacheSalt string

	// Locality says where a storage-tier copy lives relative to the engine
	// (vLLM's FS and object-store tiers); LocalityUnspecified when absent.
	Locality Locality
	// Ownership names the secondary offloading tier that produced the
	// event, when one did; empty otherwise.
	Ownership string
}

// Locality is vLLM's locality of a stored block, relative to the engine
// that published it.
type Locality uint8

// The localities vLLM names; an absent or unrecognised value is unspecified.
const (
	LocalityUnspecified Locality = iota
	LocalityLocal
	LocalityRemote
)

// String returns the locality as vLLM writes it, or "" when unspecified.
func (l Locality) String() string {
	switch l {
	case LocalityLocal:
		return "LOCAL"
	case LocalityRemote:
		return "REMOTE"
	}
	return ""
}

// MarshalText writes the locality's name.
func (l Locality) MarshalText() ([]byte, error) { return []byte(l.String()), nil }

// UnmarshalText reads a locality's name; anything else is unspecified.
func (l *Locality) UnmarshalText(b []byte) error {
	*l = parseLocality(b)
	return nil
}

func parseLocality(b []byte) Locality {
	switch string(b) {
	case "LOCAL", "local":
		return LocalityLocal
	case "REMOTE", "remote":
		return LocalityRemote
	}
	return LocalityUnspecified
}

// Ignored names the fields publishers send that kvroute decodes but does not
// act on, so that what is dropped is counted rather than silent.
type Ignored uint8

// The ignored fields. IgnoredUnknown counts fields no known publisher
// sends, whatever their name.
const (
	IgnoredLocality Ignored = iota
	IgnoredOwnership
	IgnoredSessionID
	IgnoredEventVersion
	IgnoredUnknown

	// NumIgnored is the number of Ignored values.
	NumIgnored = 5
)

// String returns the field's wire name ("unknown" for IgnoredUnknown).
func (f Ignored) String() string {
	switch f {
	case IgnoredLocality:
		return "locality"
	case IgnoredOwnership:
		return "ownership"
	case IgnoredSessionID:
		return "session_id"
	case IgnoredEventVersion:
		return "event_version"
	}
	return "unknown"
}

// ExtraKey is one block's extras as vLLM sent them: a tuple of strings, ints
// or bytes. Only its equality to what a plain request would produce matters.
type ExtraKey []any

// Batch is one engine step's events, as vLLM's EventBatch carries them.
type Batch struct {
	// TS is the publish time in seconds since the Unix epoch.
	TS float64
	// DPRank is the data-parallel rank; HasDPRank is false for the 2-element
	// envelope of older vLLM.
	DPRank    int
	HasDPRank bool
	Events    []Event
	// Skipped counts events of unknown kind (or unknown tier) left out of Events.
	Skipped int
	// Ignored counts, per field, the fields the events carried that kvroute
	// decodes but does not act on (see Ignored).
	Ignored [NumIgnored]int
}

// Reset empties b for reuse, keeping its allocated slices.
func (b *Batch) Reset() {
	for i := range b.Events {
		b.Events[i].reset()
	}
	b.Events = b.Events[:0]
	b.TS, b.DPRank, b.HasDPRank, b.Skipped = 0, 0, false, 0
	b.Ignored = [NumIgnored]int{}
}

// reset clears e, keeping the backing arrays of its reusable slices.
func (e *Event) reset() {
	*e = Event{
		BlockHashes:     e.BlockHashes[:0],
		TokenIDs:        e.TokenIDs[:0],
		BlockOffsets:    e.BlockOffsets[:0],
		RemainingCopies: e.RemainingCopies[:0],
		OpaqueTokens:    e.OpaqueTokens[:0],
	}
}

// Blocks returns the number of blocks the batch's events name.
func (b *Batch) Blocks() int {
	n := 0
	for i := range b.Events {
		n += len(b.Events[i].BlockHashes)
	}
	return n
}
