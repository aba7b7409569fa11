package share

import (
	"bytes"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/datalayer"
)

var now0 = time.Unix(1_800_000_000, 0).UnixNano()

func sampleMessage() *Message {
	us := int64(time.Microsecond)
	return &Message{Replica: 7, Seq: 3, Now: now0, Sync: true, Complete: true, Entries: []Entry{
		{Kind: datalayer.NoteSent, ID: 1, Endpoint: "10.0.0.1:8000", At: now0 - 1500*us, Prefill: 300, Prompt: 1000, Outputs: 32,
			PrefillFor: 40 * time.Millisecond, PerToken: 12 * time.Millisecond, End: now0 + 500_000*us},
		{Kind: datalayer.NoteSent, ID: 2, Endpoint: "10.0.0.2:8000", At: now0, First: now0 - 3*us, Prompt: 64},
		{Kind: datalayer.NoteSent, ID: 5, Endpoint: "10.0.0.1:8000", At: now0 - 1},
		{Kind: datalayer.NoteFirst, ID: 3, At: now0 - 20*us, End: now0 + 99*us},
		{Kind: datalayer.NoteDone, ID: 4, At: now0 - 7*us},
		{Kind: datalayer.NoteFailed, ID: 9},
	}}
}

func TestAMessageDecodesAsItWasEncodedToTheMicrosecond(t *testing.T) {
	t.Parallel()
	m := sampleMessage()
	var buf bytes.Buffer
	if err := Encode(&buf, m); err != nil {
		t.Fatal(err)
	}
	var d Decoder
	got, err := d.Decode(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	// Times travel in whole microseconds from the message's clock.
	want := *m
	want.Entries = append([]Entry(nil), m.Entries...)
	want.Entries[2].At = now0
	if !reflect.DeepEqual(*got, want) {
		t.Errorf("decoded\n%+v\nwant\n%+v", *got, want)
	}
	if n := buf.Len(); n > 140 {
		t.Errorf("%d bytes for six entries: the encoding is not compact", n)
	}
}

func TestBadMessagesAreRejectedWithAClearError(t *testing.T) {
	t.Parallel()
	var good bytes.Buffer
	if err := Encode(&good, sampleMessage()); err != nil {
		t.Fatal(err)
	}
	b := good.Bytes()
	cases := []struct {
		name string
		in   []byte
	}{
		{"nothing", nil},
		{"not an array", []byte{0xc0}},
		{"a truncated message", b[:len(b)-3]},
		{"bytes after the message", append(append([]byte(nil), b...), 0x01)},
		{"another version", append([]byte{0x97, 0x02}, b[2:]...)},
		{"a huge entry count", []byte{0x97, 0x01, 0x01, 0x01, 0x01, 0x00, 0x90, 0xdd, 0xff, 0xff, 0xff, 0xff}},
		{"a huge endpoint table", []byte{0x97, 0x01, 0x01, 0x01, 0x01, 0x00, 0xdd, 0x7f, 0xff, 0xff, 0xff}},
		{"an endpoint index past the table", []byte{0x97, 0x01, 0x01, 0x01, 0x01, 0x00, 0x90, 0x91, 0x9b, 0x01, 0x01, 0x00, 0xc0, 0, 0, 0, 0, 0, 0xc0, 0xc0}},
		{"an id of zero", []byte{0x97, 0x01, 0x01, 0x01, 0x01, 0x00, 0x90, 0x91, 0x92, 0x04, 0x00}},
		{"an unknown kind", []byte{0x97, 0x01, 0x01, 0x01, 0x01, 0x00, 0x90, 0x91, 0x92, 0x09, 0x01}},
		{"a time a year away", []byte{0x97, 0x01, 0x01, 0x01, 0x01, 0x00, 0x90, 0x91, 0x93, 0x03, 0x01, 0xd3, 0x00, 0x00, 0x1c, 0xb2, 0x8d, 0xf9, 0x80, 0x00}},
	}
	var d Decoder
	for _, c := range cases {
		if _, err := d.Decode(c.in); !errors.Is(err, ErrBadMessage) {
			t.Errorf("%s: error %v, want ErrBadMessage", c.name, err)
		}
	}
	if _, err := d.Decode(b); err != nil {
		t.Errorf("the decoder does not recover after bad input: %v", err)
	}
}

func FuzzDecode(f *testing.F) {
	var buf bytes.Buffer
	if err := Encode(&buf, sampleMessage()); err != nil {
		f.Fatal(err)
	}
	f.Add(buf.Bytes())
	buf.Reset()
	if err := Encode(&buf, &Message{Replica: 1, Seq: 1, Now: 1}); err != nil {
		f.Fatal(err)
	}
	f.Add(buf.Bytes())
	f.Fuzz(func(t *testing.T, b []byte) {
		var d Decoder
		m, err := d.Decode(b)
		if err != nil {
			return
		}
		// What decodes encodes again, and decodes to the same.
		var again bytes.Buffer
		if err := Encode(&again, m); err != nil {
			t.Fatalf("re-encoding %+v: %v", m, err)
		}
		first := *m
		first.Entries = append([]Entry(nil), m.Entries...)
		var d2 Decoder
		m2, err := d2.Decode(again.Bytes())
		if err != nil {
			t.Fatalf("re-encoded message does not decode: %v", err)
		}
		if !reflect.DeepEqual(first, *m2) {
			t.Fatalf("round trip changed the message:\n%+v\n%+v", first, *m2)
		}
	})
}
