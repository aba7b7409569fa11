package extproc_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/pkg/requestpath/extproc"
	"github.com/kvroute/kvroute/pkg/testkit"
	"github.com/kvroute/kvroute/pkg/testkit/envoy"
	"github.com/kvroute/kvroute/pkg/testkit/fleet"
)

// issuer is a certificate authority of the test's own.
type issuer struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

var serial int64

func newIssuer(t *testing.T, name string) *issuer {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial++
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &issuer{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// leaf issues a certificate for name, a server's or a client's; it
// returns the PEM of the certificate and of its key.
func (is *issuer) leaf(t *testing.T, name string, usage x509.ExtKeyUsage) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial++
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, is.cert, &key.PublicKey, is.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

func (is *issuer) client(t *testing.T, name string) tls.Certificate {
	t.Helper()
	c, k := is.leaf(t, name, x509.ExtKeyUsageClientAuth)
	pair, err := tls.X509KeyPair(c, k)
	if err != nil {
		t.Fatal(err)
	}
	return pair
}

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
	serverCA, gatewayCA, rogueCA := newIssuer(t, "server-ca"), newIssuer(t, "gateway-ca"), newIssuer(t, "rogue-ca")
	c, k := serverCA.leaf(t, "epp", x509.ExtKeyUsageServerAuth)
	writeAtomically(t, certFile, c)
	writeAtomically(t, keyFile, k)
	writeAtomically(t, caFile, gatewayCA.pem)

	reg := prometheus.NewRegistry()
	s, err := extproc.New(f.Director, extproc.Options{Addr: "127.0.0.1:0", CertFile: certFile, KeyFile: keyFile, ClientCAFile: caFile, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("ext_proc server: %v", err)
		}
	})

	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(serverCA.pem)
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

	res, err := ask(&tls.Config{Certificates: []tls.Certificate{gatewayCA.client(t, "gateway")}})
	routed(t, res, err)
	res, err = ask(&tls.Config{})
	refused(t, "a peer without a certificate", res, err)
	res, err = ask(&tls.Config{Certificates: []tls.Certificate{rogueCA.client(t, "rogue")}})
	refused(t, "a peer whose certificate another CA signed", res, err)

	// The CA rotates: the rogue CA's clients are now the gateways, and the
	// old ones are refused.
	writeAtomically(t, caFile, rogueCA.pem)
	testkit.WaitFor(t, "the new client CA to be in use", func() bool {
		res, err := ask(&tls.Config{Certificates: []tls.Certificate{rogueCA.client(t, "gateway-2")}})
		return err == nil && res.Destination != ""
	})
	res, err = ask(&tls.Config{Certificates: []tls.Certificate{gatewayCA.client(t, "gateway")}})
	refused(t, "a gateway of the rotated-out CA", res, err)

	// The server's key pair rotates to one another CA signed: a client
	// trusting only that CA connects once it is in use.
	newServerCA := newIssuer(t, "server-ca-2")
	c, k = newServerCA.leaf(t, "epp", x509.ExtKeyUsageServerAuth)
	writeAtomically(t, keyFile, k)
	writeAtomically(t, certFile, c)
	roots = x509.NewCertPool()
	roots.AppendCertsFromPEM(newServerCA.pem)
	testkit.WaitFor(t, "the new key pair to be in use", func() bool {
		res, err := ask(&tls.Config{Certificates: []tls.Certificate{rogueCA.client(t, "gateway-2")}})
		return err == nil && res.Destination != ""
	})
	// A half-written rotation (a key that does not match) keeps the last
	// good pair.
	writeAtomically(t, keyFile, []byte("not a key"))
	testkit.WaitFor(t, "the broken files to be noticed", func() bool {
		res, err := ask(&tls.Config{Certificates: []tls.Certificate{rogueCA.client(t, "gateway-2")}})
		if err != nil || res.Destination == "" {
			t.Fatalf("a broken key file took the server down: %v", err)
		}
		return testkit.Value(t, reg, "kvroute_extproc_tls_reloads_total", "result", "error") >= 1
	})
	if _, err := extproc.New(f.Director, extproc.Options{Addr: "127.0.0.1:0", Plaintext: true, ClientCAFile: caFile}); err == nil {
		t.Error("plaintext with a client CA was accepted")
	}
}
