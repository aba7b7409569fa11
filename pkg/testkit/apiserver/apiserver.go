// Package apiserver runs envtest's real kube-apiserver and etcd for one
// test binary: started once in TestMain, shared by the package's tests
// (each of which works in a namespace of its own), stopped at the end.
package apiserver

import (
	"flag"
	"fmt"
	"os"
	"testing"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

// Server is a test binary's API server.
type Server struct {
	// Config reaches the API server; nil when none runs (then skip says why).
	Config *rest.Config
	skip   string
}

// Main starts the API server with the CRDs in crdDirs installed, runs the
// tests, and stops it; TestMain passes its result to os.Exit. Without
// KUBEBUILDER_ASSETS (scripts/envtest-assets.sh prints it), or when fuzzing
// (a worker process per CPU would each start one), the tests that need it
// skip, saying why. KUBEBUILDER_ASSETS set but unusable is a failure.
func (s *Server) Main(m *testing.M, crdDirs ...string) int {
	ctrllog.SetLogger(logr.Discard())
	klog.SetLogger(logr.Discard())
	flag.Parse()
	if f := flag.Lookup("test.fuzz"); f != nil && f.Value.String() != "" {
		s.skip = "fuzzing: no API server"
		return m.Run()
	}
	assets := os.Getenv("KUBEBUILDER_ASSETS")
	if assets == "" {
		s.skip = "KUBEBUILDER_ASSETS is unset: run `export KUBEBUILDER_ASSETS=\"$(scripts/envtest-assets.sh)\"` (make test does) to test against a real API server"
		return m.Run()
	}
	env := &envtest.Environment{
		BinaryAssetsDirectory: assets,
		CRDDirectoryPaths:     crdDirs,
		ErrorIfCRDPathMissing: true,
	}
	cfg, err := env.Start()
	if err != nil {
		fmt.Fprintf(os.Stderr, "envtest: KUBEBUILDER_ASSETS=%q is set but the API server did not start: %v\n", assets, err)
		return 1
	}
	s.Config = cfg
	code := m.Run()
	if err := env.Stop(); err != nil {
		fmt.Fprintf(os.Stderr, "envtest: stop: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// Require is the API server's configuration; it skips t, saying why, when
// none runs (fails it under make test, which sets KVROUTE_NO_SKIPS).
func (s *Server) Require(t testing.TB) *rest.Config {
	t.Helper()
	if s.Config == nil {
		// make test builds the assets and sets KVROUTE_NO_SKIPS: there,
		// no API server is a broken set-up.
		if os.Getenv("KVROUTE_NO_SKIPS") != "" || os.Getenv("CI") != "" {
			t.Fatal(s.skip)
		}
		t.Skip(s.skip)
	}
	return s.Config
}
