package openai

import (
	"bytes"

	"github.com/kvroute/kvroute/pkg/jsonscan"
)

// DefaultMaxSSELine bounds the bytes an SSEUsageScanner holds for one line
// and for one event's data. A usage chunk is a few hundred bytes; content
// chunks can be larger but are not needed.
const DefaultMaxSSELine = 64 << 10

// SSEUsageScanner watches a streamed (server-sent events) response for its
// token usage, which the model server sends in the final chunk when the
// request set stream_options.include_usage (and in every chunk with
// continuous usage stats). Feed it the body as it passes, in chunks split
// anywhere. Lines and events that lie whole within a chunk are read where
// they lie; only a line or an event's data that a chunk boundary cuts is
// copied, to be completed by the next chunk. Its zero value is ready to
// use; it is not safe for concurrent use.
type SSEUsageScanner struct {
	// MaxLine bounds the bytes held for a partial line and for one event's
	// data; longer lines and events are skipped and counted. Zero means
	// DefaultMaxSSELine.
	MaxLine int

	line     []byte // the current line, until its end arrives
	lineOver bool   // the current line outgrew MaxLine and is being skipped
	afterCR  bool   // the last byte was '\r', so a leading '\n' ends nothing
	// The current event's data: its one line within the chunk being
	// written (ref), or its lines joined by '\n' in data, owned here.
	ref       []byte
	data      []byte
	hasData   bool
	dataOver  bool
	usage     Usage
	seen      bool
	done      bool
	events    int
	overflows int
	errs      int
}

// Write feeds the next bytes of the stream. The scanner keeps no reference
// to chunk after it returns.
func (s *SSEUsageScanner) Write(chunk []byte) {
	if len(chunk) == 0 {
		return
	}
	if s.afterCR && chunk[0] == '\n' {
		chunk = chunk[1:]
	}
	s.afterCR = false
	for len(chunk) > 0 {
		i := bytes.IndexAny(chunk, "\r\n")
		if i < 0 {
			s.appendLine(chunk)
			break
		}
		line, owned := chunk[:i], false
		if len(s.line) > 0 || s.lineOver {
			// The line began in an earlier chunk.
			s.appendLine(line)
			line, owned = s.line, true
		} else if len(line) > s.maxLine() {
			s.overflows++
			s.dataOver = true
			s.lineOver = true
		}
		if chunk[i] == '\r' {
			if i+1 == len(chunk) {
				s.afterCR = true
			} else if chunk[i+1] == '\n' {
				i++
			}
		}
		chunk = chunk[i+1:]
		if s.lineOver {
			s.lineOver = false
		} else {
			s.processLine(line, owned)
		}
		s.line = s.line[:0]
	}
	// The chunk is the caller's: an event still open keeps its own copy.
	s.own()
}

// own copies the current event's data out of the chunk it lies in.
func (s *SSEUsageScanner) own() {
	if s.ref != nil {
		s.data = append(s.data[:0], s.ref...)
		s.ref = nil
	}
}

// Usage returns the last usage the stream carried, and whether it carried one.
func (s *SSEUsageScanner) Usage() (Usage, bool) { return s.usage, s.seen }

// Done reports whether the stream's "data: [DONE]" event has passed.
func (s *SSEUsageScanner) Done() bool { return s.done }

// Events returns how many data events the stream has carried, "[DONE]"
// left out (an event skipped for its size is not counted). A model server
// streams one per step that generated tokens for the request: one token
// each, unless it batches several into an event.
func (s *SSEUsageScanner) Events() int { return s.events }

// Overflows returns how many lines and events were skipped for exceeding MaxLine.
func (s *SSEUsageScanner) Overflows() int { return s.overflows }

// Errors returns how many events mentioned a usage that could not be read.
func (s *SSEUsageScanner) Errors() int { return s.errs }

func (s *SSEUsageScanner) maxLine() int {
	if s.MaxLine > 0 {
		return s.MaxLine
	}
	return DefaultMaxSSELine
}

func (s *SSEUsageScanner) appendLine(b []byte) {
	if s.lineOver {
		return
	}
	if len(s.line)+len(b) > s.maxLine() {
		s.lineOver = true
		s.overflows++
		s.line = s.line[:0]
		// A skipped data line leaves its event incomplete.
		s.dataOver = true
		return
	}
	s.line = append(s.line, b...)
}

// processLine reads one complete line; owned says it lies in s.line,
// which the next line overwrites.
func (s *SSEUsageScanner) processLine(line []byte, owned bool) {
	if len(line) == 0 {
		s.dispatch()
		return
	}
	field, value := line, []byte(nil)
	if i := bytes.IndexByte(line, ':'); i >= 0 {
		field, value = line[:i], line[i+1:]
		if len(value) > 0 && value[0] == ' ' {
			value = value[1:]
		}
	}
	// Only data lines matter; comments (":...") and other fields are skipped.
	if string(field) != "data" || s.dataOver {
		return
	}
	if !s.hasData {
		s.hasData = true
		if !owned {
			// Read where it lies, if the event ends within this chunk.
			s.ref = value
			return
		}
		s.data = append(s.data[:0], value...)
		return
	}
	s.own()
	if len(s.data)+1+len(value) > s.maxLine() {
		s.dataOver = true
		s.overflows++
		return
	}
	s.data = append(s.data, '\n')
	s.data = append(s.data, value...)
}

func (s *SSEUsageScanner) dispatch() {
	data, ok := s.data, s.hasData && !s.dataOver
	if s.ref != nil {
		data = s.ref
	}
	s.ref, s.data, s.hasData, s.dataOver = nil, s.data[:0], false, false
	if !ok {
		return
	}
	if string(bytes.TrimSpace(data)) == "[DONE]" {
		s.done = true
		return
	}
	s.events++
	// Most chunks carry "usage":null or no usage at all; decoding them
	// would cost a JSON parse per generated token.
	if !mentionsUsage(data) {
		return
	}
	u, found, err := ParseUsage(data)
	switch {
	case err != nil:
		s.errs++
	case found:
		s.usage, s.seen = u.merge(s.usage), true
	}
}

// mentionsUsage reports whether data may hold a non-null "usage" member.
// Inside a JSON string a quote is escaped, so `"usage"` outside an escape is
// a key or the whole string "usage"; the decoder settles which.
func mentionsUsage(data []byte) bool {
	const key = `"usage"`
	for {
		i := bytes.Index(data, []byte(key))
		if i < 0 {
			return false
		}
		rest := data[i+len(key):]
		j := jsonscan.SkipSpace(rest, 0)
		if j < len(rest) && rest[j] == ':' {
			j = jsonscan.SkipSpace(rest, j+1)
			if !bytes.HasPrefix(rest[j:], []byte("null")) {
				return true
			}
		}
		data = rest
	}
}
