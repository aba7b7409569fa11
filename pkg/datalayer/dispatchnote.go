package datalayer

import (
	"sync/atomic"
	"time"
)

// DispatchNote is one step of a dispatch this EPP made, as told to a
// DispatchListener: what peer EPP replicas need to account for it as
// their own. Times are Unix nanoseconds of this EPP's clock, zero where
// none is known.
type DispatchNote struct {
	Kind NoteKind
	// Endpoint is the endpoint's name in the datastore.
	Endpoint string
	// At is when the step happened: the dispatch, the first token, the end.
	At int64
	// Prefill, Prompt and Outputs are the dispatch's uncached prompt
	// tokens, prompt tokens and max_tokens (NoteSent only).
	Prefill, Prompt, Outputs int
	// PrefillFor and PerToken are its predicted prefill time alone and
	// pace of decode (NoteSent only; zero: unknown).
	PrefillFor, PerToken time.Duration
	// End is when the dispatch is expected to finish (NoteSent and
	// NoteFirst; zero: unknown).
	End int64
}

// NoteKind is which step of a dispatch a DispatchNote tells.
type NoteKind uint8

// The steps of a dispatch.
const (
	// NoteSent: the request went to Endpoint.
	NoteSent NoteKind = 1
	// NoteFirst: its first token came back.
	NoteFirst NoteKind = 2
	// NoteDone: it ended (a response that did not fail).
	NoteDone NoteKind = 3
	// NoteFailed: it ended in failure.
	NoteFailed NoteKind = 4
)

// DispatchListener hears the steps of the dispatches this EPP makes and
// announces (Dispatch.Announce), each under an id unique in this
// datastore: the sharing of dispatches between EPP replicas is one. Note
// runs on the request path, so it must not block.
type DispatchListener interface {
	Note(id uint64, n DispatchNote)
}

type dispatchNotes struct {
	l      DispatchListener
	nextID atomic.Uint64
}

// SetDispatchListener makes l hear every dispatch announced from now on
// (nil: none).
func (ds *Datastore) SetDispatchListener(l DispatchListener) {
	if l == nil {
		ds.notes.Store(nil)
		return
	}
	ds.notes.Store(&dispatchNotes{l: l})
}

// Announce tells the datastore's DispatchListener, if there is one, that
// the dispatch was made, with what is expected of it; its first token and
// its end are then told too. Call it once, after ExpectPrefill and
// ExpectDecode. A dispatch that is never announced is told to no one:
// dispatches that peers made are accounted here that way.
func (d *Dispatch) Announce() {
	if d == nil || d.notes == nil || d.id != 0 || d.state.Load() != 0 {
		return
	}
	d.id = d.notes.nextID.Add(1)
	var end int64
	if d.prefillFor > 0 && d.perToken > 0 && d.outputs > 0 {
		end = d.start + int64(d.prefillFor) + int64(d.outputs-1)*int64(d.perToken)
	}
	d.notes.l.Note(d.id, DispatchNote{
		Kind: NoteSent, Endpoint: d.name, At: d.start,
		Prefill: int(d.prefill), Prompt: int(d.prompt), Outputs: d.outputs,
		PrefillFor: d.prefillFor, PerToken: d.perToken, End: end,
	})
}

// tell tells the listener a later step of an announced dispatch.
func (d *Dispatch) tell(kind NoteKind, at, end int64) {
	if d.id != 0 {
		d.notes.l.Note(d.id, DispatchNote{Kind: kind, Endpoint: d.name, At: at, End: end})
	}
}
