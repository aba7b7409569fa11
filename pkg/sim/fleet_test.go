package sim

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/sim/blockpool"
)

// TestAFleetServesOnTheListenersItIsGiven places two engines on addresses
// of their own with one port, as pods have, and finds each serving there
// under that address; a listener that cannot be had stops the start.
func TestAFleetServesOnTheListenersItIsGiven(t *testing.T) {
	t.Parallel()
	first, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(first.Addr().(*net.TCPAddr).Port)
	second, err := net.Listen("tcp", net.JoinHostPort("127.0.0.3", port))
	if err != nil {
		_ = first.Close()
		t.Fatal(err)
	}
	lns := []net.Listener{first, second}
	f, err := StartFleet(context.Background(), FleetConfig{
		Engines: 2, Model: "m", Pool: blockpool.Config{BlockSize: 4, GPUBlocks: 64},
		Timing: Timing{PrefillPerToken: time.Microsecond, DecodeStep: 100 * time.Microsecond, MaxSeqs: 2},
		Listen: func(i int) (net.Listener, error) { return lns[i], nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := f.Close(); err != nil {
			t.Error(err)
		}
	}()
	for i, want := range []string{"127.0.0.2:" + port, "127.0.0.3:" + port} {
		s := f.Servers[i]
		if s.Addr() != want || s.Core().Engine().Config().Address != want {
			t.Errorf("engine %d serves at %s as %s, want %s", i, s.Addr(), s.Core().Engine().Config().Address, want)
		}
		res, err := http.Get("http://" + want + "/v1/models")
		if err != nil {
			t.Fatal(err)
		}
		_ = res.Body.Close()
		if res.StatusCode != http.StatusOK {
			t.Errorf("GET %s/v1/models: %s", want, res.Status)
		}
	}

	refused := errors.New("no address for this engine")
	if _, err := StartFleet(context.Background(), FleetConfig{
		Engines: 1, Model: "m", Pool: blockpool.Config{BlockSize: 4, GPUBlocks: 64},
		Listen: func(int) (net.Listener, error) { return nil, refused },
	}); !errors.Is(err, refused) {
		t.Errorf("a fleet whose listener fails started with %v, want %v", err, refused)
	}
}
