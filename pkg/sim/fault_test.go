package sim

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
)

func TestAServersFaultsCanBeSwitchedWhileItRuns(t *testing.T) {
	t.Parallel()
	s := startServer(t)
	const body = `{"model":"m","prompt":"one two three four five six seven eight","max_tokens":4}`
	served := func(t *testing.T) {
		t.Helper()
		// A fresh client each time: refusing closed every idle connection.
		resp, err := (&http.Client{Transport: &http.Transport{}}).Post("http://"+s.Addr()+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		code := resp.StatusCode
		b, _ := io.ReadAll(resp.Body)
		var r struct{ Usage usage }
		if err := json.Unmarshal(b, &r); code != http.StatusOK || err != nil || r.Usage.CompletionTokens != 4 {
			t.Fatalf("%d %s (%v): want a 4-token completion", code, b, err)
		}
	}
	served(t)

	if err := s.SetFault(FaultError); err != nil {
		t.Fatal(err)
	}
	if code, b := post(t, s, "/v1/completions", body); code != http.StatusInternalServerError {
		t.Fatalf("with FaultError: %d %s, want 500", code, b)
	}

	if err := s.SetFault(FaultFabricate); err != nil {
		t.Fatal(err)
	}
	code, b := post(t, s, "/v1/completions", body)
	var r struct{ Usage usage }
	if err := json.Unmarshal(b, &r); code != http.StatusOK || err != nil || r.Usage.CompletionTokens != 0 ||
		r.Usage.PromptTokensDetails.CachedTokens != r.Usage.PromptTokens {
		t.Fatalf("with FaultFabricate: %d %s (%v), want a 200 with no output and every prompt token cached", code, b, err)
	}

	if err := s.SetFault(FaultRefuse); err != nil {
		t.Fatal(err)
	}
	// A fresh client: no kept-alive connection to reuse.
	client := &http.Client{Transport: &http.Transport{}}
	_, err := client.Post("http://"+s.Addr()+"/v1/completions", "application/json", strings.NewReader(body))
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("with FaultRefuse: %v, want the connection refused", err)
	}

	if err := s.SetFault(FaultNone); err != nil {
		t.Fatal(err)
	}
	served(t)
}
