package extproc_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/pkg/requestpath/extproc"
	"github.com/kvroute/kvroute/pkg/testkit"
	"github.com/kvroute/kvroute/pkg/testkit/envoy"
	"github.com/kvroute/kvroute/pkg/testkit/fleet"
)

// writeAtomically replaces a file the way Kubernetes updates a mounted
// Secret: the new content appears whole.
func writeAtomically(t *testing.T, path string, data []byte) {
	t.Helper()
	tmp := path + ".new"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// TestMutualTLSAdmitsOnlyTheGatewaysTheClientCASigned: with a client CA,
// a peer without a certificate the CA signed cannot ask for picks; the key
// pair and the CA are read again when their files change.
func TestMutualTLSAdmitsOnlyTheGatewaysTheClientCASigned(t *testing.T) {
	t.Parallel()
	f := fleet.Start(t, fleet.Options{NoTokenizer: true})
	dir := t.TempDir()
	certFile, keyFile, caFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), filepath.Join(dir, "ca.crt")
	serverCA, gatewayCA, rogueCA := testkit.NewCA(t, "server-ca"), testkit.NewCA(t, "gateway-ca"), testkit.NewCA(t, "rogue-ca")
	c, k := serverCA.Leaf(t, "epp", x509.ExtKeyUsageServerAuth)
	writeAtomically(t, certFile, c)
	writeAtomically(t, keyFile, k)
	writeAtomically(t, caFile, gatewayCA.PEM)

	reg := prometheus.NewRegistry()
	s, err := extproc.New(f.Director, extproc.Options{Addr: "127.0.0.1:0", CertFile: certFile, KeyFile: keyFile, ClientCAFile: caFile, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	testkit.Go(t, "the ext_proc server", s.Run)

	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(serverCA.PEM)
	// ask opens a fresh connection (a fresh handshake) and asks for a pick.
	ask := func(cfg *tls.Config) (*envoy.Result, error) {
		cfg.RootCAs = roots
		cl, err := envoy.DialTLS(s.Addr(), cfg)
		if err != nil {
			return nil, err
		}
		defer cl.Close()
		rctx, rcancel := context.WithTimeout(context.Background(), testkit.WaitLimit)
		defer rcancel()
		return cl.Do(rctx, envoy.Request{Path: "/v1/completions", Body: completion(tokens(1, 16), false)}, envoy.HTTPUpstream(http.DefaultClient))
	}
	routed := func(t *testing.T, res *envoy.Result, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("a gateway the CA signed: %v", err)
		}
		if res.Destination == "" {
			t.Fatalf("a gateway the CA signed got no pick: %+v", res.Immediate)
		}
	}
	refused := func(t *testing.T, what string, res *envoy.Result, err error) {
		t.Helper()
		if err == nil {
			t.Fatalf("%s was answered: destination %q", what, res.Destination)
		}
	}

	res, err := ask(&tls.Config{Certificates: []tls.Certificate{gatewayCA.Pair(t, "gateway", x509.ExtKeyUsageClientAuth)}})
	routed(t, res, err)
	res, err = ask(&tls.Config{})
	refused(t, "a peer without a certificate", res, err)
	res, err = ask(&tls.Config{Certificates: []tls.Certificate{rogueCA.Pair(t, "rogue", x509.ExtKeyUsageClientAuth)}})
	refused(t, "a peer whose certificate another CA signed", res, err)

	// The CA rotates: the rogue CA's clients are now the gateways, and the
	// old ones are refused.
	writeAtomically(t, caFile, rogueCA.PEM)
	testkit.WaitFor(t, "the new client CA to be in use", func() error {
		res, err := ask(&tls.Config{Certificates: []tls.Certificate{rogueCA.Pair(t, "gateway-2", x509.ExtKeyUsageClientAuth)}})
		if err != nil {
			return err
		}
		if res.Destination == "" {
			return fmt.Errorf("res.Destination is %v, want != %v", res.Destination, "")
		}
		return nil
	})
	res, err = ask(&tls.Config{Certificates: []tls.Certificate{gatewayCA.Pair(t, "gateway", x509.ExtKeyUsageClientAuth)}})
	refused(t, "a gateway of the rotated-out CA", res, err)

	// The server's key pair rotates to one another CA signed: a client
	// trusting only that CA connects once it is in use.
	newServerCA := testkit.NewCA(t, "server-ca-2")
	c, k = newServerCA.Leaf(t, "epp", x509.ExtKeyUsageServerAuth)
	writeAtomically(t, keyFile, k)
	writeAtomically(t, certFile, c)
	roots = x509.NewCertPool()
	roots.AppendCertsFromPEM(newServerCA.PEM)
	testkit.WaitFor(t, "the new key pair to be in use", func() error {
		res, err := ask(&tls.Config{Certificates: []tls.Certificate{rogueCA.Pair(t, "gateway-2", x509.ExtKeyUsageClientAuth)}})
		if err != nil {
			return err
		}
		if res.Destination == "" {
			return fmt.Errorf("res.Destination is %v, want != %v", res.Destination, "")
		}
		return nil
	})
	// A half-written rotation (a key that does not match) keeps the last
	// good pair.
	writeAtomically(t, keyFile, []byte("not a key"))
	testkit.WaitFor(t, "the broken files to be noticed", func() error {
		res, err := ask(&tls.Config{Certificates: []tls.Certificate{rogueCA.Pair(t, "gateway-2", x509.ExtKeyUsageClientAuth)}})
		if err != nil || res.Destination == "" {
			t.Fatalf("a broken key file took the server down: %v", err)
		}
		if seen := testkit.Value(t, reg, "kvroute_extproc_tls_reloads_total", "result", "error"); seen < 1 {
			return fmt.Errorf("testkit.Value(t, reg, \"kvroute_extproc_tls_reloads_total\", \"result\", \"error\") is %v, want >= %v", seen, 1)
		}
		return nil
	})
	if _, err := extproc.New(f.Director, extproc.Options{Addr: "127.0.0.1:0", Plaintext: true, ClientCAFile: caFile}); err == nil {
		t.Error("plaintext with a client CA was accepted")
	}
}
