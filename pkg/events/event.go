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
}

// Reset empties b for reuse, keeping its allocated slices.
func (b *Batch) Reset() {
	for i := range b.Events {
		e := &b.Events[i]
		hashes, tokens := e.BlockHashes[:0], e.TokenIDs[:0]
		*e = Event{BlockHashes: hashes, TokenIDs: tokens}
	}
	b.Events = b.Events[:0]
	b.TS, b.DPRank, b.HasDPRank, b.Skipped = 0, 0, false, 0
}

// Blocks returns the number of blocks the batch's events name.
func (b *Batch) Blocks() int {
	n := 0
	for i := range b.Events {
		n += len(b.Events[i].BlockHashes)
	}
	return n
}
