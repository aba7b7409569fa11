package relay

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/testkit"
	"github.com/kvroute/kvroute/pkg/transport/natsembed"
)

// zmtpFrame encodes one ZMTP frame header and body.
func zmtpFrame(more bool, body []byte) []byte {
	var flags byte
	if more {
		flags |= zmtpFlagMore
	}
	if len(body) > 255 {
		var b [9]byte
		b[0] = flags | zmtpFlagLong
		binary.BigEndian.PutUint64(b[1:], uint64(len(body)))
		return append(b[:], body...)
	}
	return append([]byte{flags, byte(len(body))}, body...)
}

func longHeader(size uint64) []byte {
	var b [9]byte
	b[0] = zmtpFlagLong
	binary.BigEndian.PutUint64(b[1:], size)
	return b[:]
}

func TestZMTPScannerCutsOversizedMessages(t *testing.T) {
	t.Parallel()
	greeting := make([]byte, zmtpGreetingLen)
	many := bytes.Repeat(zmtpFrame(true, []byte("x")), maxMessageFrames)
	tests := []struct {
		name   string
		stream []byte
		ok     bool
	}{
		{"a vLLM batch passes", bytes.Join([][]byte{greeting, zmtpFrame(true, []byte("kv@t")), zmtpFrame(true, make([]byte, 8)), zmtpFrame(false, make([]byte, 70000))}, nil), true},
		{"many messages pass, each within bounds", bytes.Join([][]byte{greeting, bytes.Repeat(zmtpFrame(false, make([]byte, 300)), 1000)}, nil), true},
		{"a frame announcing a huge size is cut", append(append([]byte{}, greeting...), longHeader(1<<40)...), false},
		{"a size just past the bound is cut", append(append([]byte{}, greeting...), longHeader(MaxMessageBytes+1)...), false},
		{"too many frames in one message are cut", bytes.Join([][]byte{greeting, many, zmtpFrame(false, nil)}, nil), false},
		{"as many frames as allowed pass", bytes.Join([][]byte{greeting, many[:len(many)-3], zmtpFrame(false, nil)}, nil), true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			for _, step := range []int{1, 7, 64, len(tc.stream)} {
				var z zmtpScanner
				var err error
				for p := tc.stream; len(p) > 0 && err == nil; {
					n := min(step, len(p))
					err = z.scan(p[:n])
					p = p[n:]
				}
				if (err == nil) != tc.ok {
					t.Fatalf("read %d bytes at a time: err %v, want ok %v", step, err, tc.ok)
				}
				if err != nil && !errors.Is(err, ErrFrameTooLarge) {
					t.Fatalf("error %v does not wrap ErrFrameTooLarge", err)
				}
			}
		})
	}
}

func FuzzZMTPScanner(f *testing.F) {
	f.Add(append(make([]byte, zmtpGreetingLen), zmtpFrame(false, []byte("hello"))...), uint8(3))
	f.Add(append(make([]byte, zmtpGreetingLen), longHeader(1<<62)...), uint8(1))
	f.Fuzz(func(t *testing.T, stream []byte, step uint8) {
		var whole zmtpScanner
		want := whole.scan(stream)
		var z zmtpScanner
		var got error
		n := int(step%32) + 1
		for p := stream; len(p) > 0 && got == nil; {
			k := min(n, len(p))
			got = z.scan(p[:k])
			p = p[k:]
		}
		if (got == nil) != (want == nil) {
			t.Fatalf("whole stream: %v; %d bytes at a time: %v", want, n, got)
		}
	})
}

func TestRelaySurvivesAPeerAnnouncingAHugeFrame(t *testing.T) {
	t.Parallel()
	ns := startNATS(t, natsembed.Options{})
	defer ns.Shutdown()
	r := startRelay(t, baseConfig(), ns.ClientURL())
	c, err := net.Dial("tcp", r.ZMQAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// A ZMTP 3.0 greeting for the NULL mechanism, then a frame header
	// claiming a terabyte.
	greeting := make([]byte, zmtpGreetingLen)
	greeting[0], greeting[9], greeting[10], greeting[11] = 0xff, 0x7f, 3, 0
	copy(greeting[12:], "NULL")
	if _, err := c.Write(append(greeting, longHeader(1<<40)...)); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(waitLimit))
	buf := make([]byte, 256)
	for {
		if _, err := c.Read(buf); err != nil {
			break // the relay hung up, and is still running
		}
	}
	testkit.WaitFor(t, "the relay to stay ready", func() error {
		if !r.Ready() {
			return errors.New("r.Ready() is false")
		}
		return nil
	})
}
