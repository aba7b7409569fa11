package proxy

import "testing"

func TestThePrefillFailureFlagReadsItsTwoPolicies(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		in   string
		want PrefillFailure
		ok   bool
	}{{"refuse", PrefillFailRefuse, true}, {"decode-only", PrefillFailDecodeOnly, true}, {"decode_only", 0, false}, {"", 0, false}} {
		var f PrefillFailure
		err := f.Set(tt.in)
		if (err == nil) != tt.ok || (tt.ok && (f != tt.want || f.String() != tt.in)) {
			t.Errorf("Set(%q) = %v, %v; want %v (ok %v)", tt.in, f, err, tt.want, tt.ok)
		}
	}
}
