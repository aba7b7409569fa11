package envoy

import (
	"bytes"
	"testing"
)

func TestSplitCutsWhereAskedAndLosesNothing(t *testing.T) {
	t.Parallel()
	body := []byte("0123456789")
	tests := []struct {
		name   string
		body   []byte
		splits []int
		n      int
		want   []string
	}{
		{"one chunk when n is 1", body, nil, 1, []string{"0123456789"}},
		{"n nearly equal chunks", body, nil, 3, []string{"012", "345", "6789"}},
		{"no more chunks than bytes", []byte("ab"), nil, 5, []string{"a", "b"}},
		{"an empty body is one empty chunk", nil, nil, 4, []string{""}},
		{"explicit offsets", body, []int{0, 4, 4, 10}, 0, []string{"", "0123", "", "456789", ""}},
		{"offsets past the end are clamped", body, []int{20}, 0, []string{"0123456789", ""}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := Split(tt.body, tt.splits, tt.n)
			if len(got) != len(tt.want) {
				t.Fatalf("chunks %q, want %q", got, tt.want)
			}
			for i := range got {
				if string(got[i]) != tt.want[i] {
					t.Fatalf("chunks %q, want %q", got, tt.want)
				}
			}
			if !bytes.Equal(bytes.Join(got, nil), tt.body) {
				t.Errorf("joined chunks differ from the body")
			}
		})
	}
}
