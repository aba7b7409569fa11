package relay

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"

	"github.com/kvroute/kvroute/pkg/transport/natsauth"
)

func TestNATSOptionsRejectsWhatCannotConnect(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		o    NATSOptions
	}{
		{"two ways to authenticate", NATSOptions{Auth: natsauth.Config{Token: "t", User: "u", Password: "p"}}},
		{"a client certificate without its key", NATSOptions{Auth: natsauth.Config{CertFile: "c.pem"}}},
		{"an nkey seed file that does not exist", NATSOptions{Auth: natsauth.Config{NKeySeedFile: "/nonexistent/seed"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if _, err := DialNATS(tc.o); !errors.Is(err, ErrNATSOptions) {
				t.Fatalf("DialNATS returned %v, want ErrNATSOptions", err)
			}
		})
	}
}

func TestBackoffDoublesUpToItsBound(t *testing.T) {
	t.Parallel()
	base, most := 100*time.Millisecond, time.Second
	for attempts, want := range map[int]time.Duration{1: 100 * time.Millisecond, 2: 200 * time.Millisecond, 4: 800 * time.Millisecond, 9: time.Second} {
		if got := backoff(attempts, base, most); got < want || got > want+want/5 {
			t.Errorf("attempt %d waits %v, want %v plus at most 20%%", attempts, got, want)
		}
	}
}

// startAuthNATS starts a server with the given options on loopback.
func startAuthNATS(t *testing.T, opts *server.Options) string {
	t.Helper()
	opts.Host, opts.Port, opts.NoLog, opts.NoSigs = "127.0.0.1", server.RANDOM_PORT, true, true
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(waitLimit) {
		t.Fatal("nats server not ready")
	}
	t.Cleanup(s.Shutdown)
	scheme := "nats://"
	if opts.TLSConfig != nil {
		scheme = "tls://"
	}
	return scheme + s.Addr().String()
}

func TestDialNATSAuthenticatesEachWay(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := kp.Seed()
	pub, _ := kp.PublicKey()
	seedFile := filepath.Join(dir, "user.nk")
	if err := os.WriteFile(seedFile, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	tlsConf, caFile, certFile, keyFile := testPKI(t, dir)

	tests := []struct {
		name   string
		server server.Options
		dial   NATSOptions
	}{
		{"with a user and password", server.Options{Username: "relay", Password: "s3cret"}, NATSOptions{Auth: natsauth.Config{User: "relay", Password: "s3cret"}}},
		{"with a token", server.Options{Authorization: "tok"}, NATSOptions{Auth: natsauth.Config{Token: "tok"}}},
		{"with an nkey seed file", server.Options{Nkeys: []*server.NkeyUser{{Nkey: pub}}}, NATSOptions{Auth: natsauth.Config{NKeySeedFile: seedFile}}},
		{"over TLS with a client certificate", server.Options{TLSConfig: tlsConf, TLSVerify: true, TLSTimeout: 5}, NATSOptions{Auth: natsauth.Config{CAFile: caFile, CertFile: certFile, KeyFile: keyFile}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.dial.URL = startAuthNATS(t, &tc.server)
			nc, err := DialNATS(tc.dial)
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			deadline := time.Now().Add(waitLimit)
			for !nc.IsConnected() {
				if time.Now().After(deadline) {
					t.Fatalf("not connected: %v", nc.LastError())
				}
				time.Sleep(10 * time.Millisecond)
			}
			if err := nc.Publish("x", nil); err != nil {
				t.Fatal(err)
			}
			if err := nc.FlushTimeout(waitLimit); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// testPKI writes a CA and server and client certificates for 127.0.0.1,
// and returns the server's TLS config (requiring a client certificate)
// and the client's files.
func testPKI(t *testing.T, dir string) (*tls.Config, string, string, string) {
	t.Helper()
	newKey := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	caKey := newKey()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	leaf := func(serial int64, usage x509.ExtKeyUsage) ([]byte, *ecdsa.PrivateKey) {
		k := newKey()
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "leaf"},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			ExtKeyUsage: []x509.ExtKeyUsage{usage}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
			KeyUsage: x509.KeyUsageDigitalSignature,
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		return der, k
	}
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	keyDER := func(k *ecdsa.PrivateKey) []byte {
		b, err := x509.MarshalECPrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	srvDER, srvKey := leaf(2, x509.ExtKeyUsageServerAuth)
	cliDER, cliKey := leaf(3, x509.ExtKeyUsageClientAuth)
	caFile := write("ca.pem", "CERTIFICATE", caDER)
	certFile := write("client.pem", "CERTIFICATE", cliDER)
	keyFile := write("client-key.pem", "EC PRIVATE KEY", keyDER(cliKey))
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	conf := &tls.Config{
		Certificates: []tls.Certificate{{Certificate: [][]byte{srvDER}, PrivateKey: srvKey}},
		ClientCAs:    pool,
		ClientAuth:   tls.RequireAndVerifyClientCert,
		MinVersion:   tls.VersionTLS12,
	}
	return conf, caFile, certFile, keyFile
}
