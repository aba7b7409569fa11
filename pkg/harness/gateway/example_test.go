package gateway_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/kvroute/kvroute/pkg/harness/gateway"
)

// A gateway without ext_proc hosts routes round-robin over its endpoints:
// the second path to the engines, past every EPP. With Options.Hosts it
// asks those EPP replicas instead, over ext_proc, for every request.
func ExampleStart() {
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "served "+r.URL.Path)
	}))
	defer engine.Close()
	g, err := gateway.Start(gateway.Options{Endpoints: []string{strings.TrimPrefix(engine.URL, "http://")}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer g.Close()
	resp, err := http.Post(g.URL()+"/v1/completions", "application/json", strings.NewReader(`{"model":"m","prompt":"hi"}`))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Println(resp.StatusCode, string(body))
	// Output: 200 served /v1/completions
}
