package natsauth

import (
	"crypto/x509"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/kvroute/kvroute/pkg/testkit"
)

func startServer(t *testing.T, o *server.Options) string {
	t.Helper()
	o.Host, o.Port, o.NoLog, o.NoSigs = "127.0.0.1", -1, true, true
	s, err := server.NewServer(o)
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("server not ready")
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	if o.TLSConfig != nil {
		return "tls://" + s.Addr().String()
	}
	return "nats://" + s.Addr().String()
}

func writeFile(t *testing.T, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// certs makes a CA, a server certificate for 127.0.0.1 and a client
// certificate, all signed by the CA, as PEM files.
type certs struct{ ca, serverCert, serverKey, clientCert, clientKey string }

func makeCerts(t *testing.T) certs {
	t.Helper()
	ca := testkit.NewCA(t, "kvroute test CA")
	var c certs
	c.ca = writeFile(t, "ca.pem", ca.PEM)
	sc, sk := ca.Leaf(t, "127.0.0.1", x509.ExtKeyUsageServerAuth)
	c.serverCert, c.serverKey = writeFile(t, "cert.pem", sc), writeFile(t, "key.pem", sk)
	cc, ck := ca.Leaf(t, "127.0.0.1", x509.ExtKeyUsageClientAuth)
	c.clientCert, c.clientKey = writeFile(t, "cert.pem", cc), writeFile(t, "key.pem", ck)
	return c
}

func TestEachCredentialConnectsAndItsAbsenceIsRefused(t *testing.T) {
	nk, _ := nkeys.CreateUser()
	nkPub, _ := nk.PublicKey()
	nkSeed, _ := nk.Seed()
	c := makeCerts(t)

	tests := []struct {
		name   string
		server func(t *testing.T) *server.Options
		cfg    func(t *testing.T) Config
	}{
		{"user and password", func(*testing.T) *server.Options {
			return &server.Options{Users: []*server.User{{Username: "epp", Password: "pw"}}}
		}, func(*testing.T) Config { return Config{User: "epp", Password: "pw"} }},
		{"a token", func(*testing.T) *server.Options {
			return &server.Options{Authorization: "s3cret"}
		}, func(*testing.T) Config { return Config{Token: "s3cret"} }},
		{"a token file", func(*testing.T) *server.Options {
			return &server.Options{Authorization: "projected-token"}
		}, func(t *testing.T) Config {
			return Config{TokenFile: writeFile(t, "token", []byte("projected-token\n"))}
		}},
		{"an nkey seed file", func(*testing.T) *server.Options {
			return &server.Options{Nkeys: []*server.NkeyUser{{Nkey: nkPub}}}
		}, func(t *testing.T) Config { return Config{NKeySeedFile: writeFile(t, "user.nk", nkSeed)} }},
		{"a creds file under an operator", nil, nil},
		{"TLS with a CA and a client certificate", func(t *testing.T) *server.Options {
			tc, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: c.serverCert, KeyFile: c.serverKey, CaFile: c.ca, Verify: true})
			if err != nil {
				t.Fatal(err)
			}
			return &server.Options{TLSConfig: tc, TLSVerify: true, TLSTimeout: 2}
		}, func(*testing.T) Config { return Config{CAFile: c.ca, CertFile: c.clientCert, KeyFile: c.clientKey} }},
	}
	// The creds case needs an operator, an account and a user signed in
	// turn, as nsc would make them.
	tests[4].server, tests[4].cfg = operatorServer()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			url := startServer(t, tt.server(t))
			opts, err := tt.cfg(t).Options()
			if err != nil {
				t.Fatal(err)
			}
			nc, err := nats.Connect(url, append(opts, nats.Timeout(5*time.Second))...)
			if err != nil {
				t.Fatalf("connect with credentials: %v", err)
			}
			if err := nc.Publish("kv.events.x", nil); err != nil {
				t.Error(err)
			}
			nc.Close()
			// Without them the server refuses; TLS alone still needs the CA.
			var bare []nats.Option
			if tt.cfg(t).CAFile != "" {
				bare = append(bare, nats.RootCAs(c.ca))
			}
			if nc, err := nats.Connect(url, append(bare, nats.Timeout(2*time.Second))...); err == nil {
				nc.Close()
				t.Fatal("connected without credentials")
			}
		})
	}
}

func operatorServer() (func(*testing.T) *server.Options, func(*testing.T) Config) {
	var creds []byte
	srv := func(t *testing.T) *server.Options {
		op, _ := nkeys.CreateOperator()
		opPub, _ := op.PublicKey()
		oc := jwt.NewOperatorClaims(opPub)
		acc, _ := nkeys.CreateAccount()
		accPub, _ := acc.PublicKey()
		ac := jwt.NewAccountClaims(accPub)
		accJWT, err := ac.Encode(op)
		if err != nil {
			t.Fatal(err)
		}
		user, _ := nkeys.CreateUser()
		userPub, _ := user.PublicKey()
		uc := jwt.NewUserClaims(userPub)
		uc.IssuerAccount = accPub
		userJWT, err := uc.Encode(acc)
		if err != nil {
			t.Fatal(err)
		}
		seed, _ := user.Seed()
		if creds, err = jwt.FormatUserConfig(userJWT, seed); err != nil {
			t.Fatal(err)
		}
		res := &server.MemAccResolver{}
		if err := res.Store(accPub, accJWT); err != nil {
			t.Fatal(err)
		}
		return &server.Options{TrustedOperators: []*jwt.OperatorClaims{oc}, AccountResolver: res}
	}
	cfg := func(t *testing.T) Config { return Config{CredsFile: writeFile(t, "user.creds", creds)} }
	return srv, cfg
}

func TestOptionsRefuseMistakes(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		cfg  Config
	}{
		{"two ways to authenticate", Config{User: "a", Password: "b", Token: "c"}},
		{"a password without a user", Config{Password: "b"}},
		{"half a client certificate", Config{CertFile: "cert.pem"}},
		{"an nkey seed file that is not there", Config{NKeySeedFile: "/nonexistent/seed"}},
		{"a creds file that is not there", Config{CredsFile: "/nonexistent/creds"}},
		{"a token file that is not there", Config{TokenFile: "/nonexistent/token"}},
		{"an inbox prefix with a wildcard", Config{InboxPrefix: "_INBOX_epp.>"}},
		{"an inbox prefix ending in a dot", Config{InboxPrefix: "_INBOX_epp."}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if _, err := tt.cfg.Options(); !errors.Is(err, ErrConfig) {
				t.Errorf("err = %v, want ErrConfig", err)
			}
		})
	}
	if opts, err := (Config{}).Options(); err != nil || len(opts) != 0 {
		t.Errorf("zero Config = %d options, %v; want none", len(opts), err)
	}
}

// The kubelet rewrites a projected token before it expires: each connect
// must send what the file holds then.
func TestATokenFileIsReadAtEveryConnect(t *testing.T) {
	t.Parallel()
	url := startServer(t, &server.Options{Authorization: "second"})
	path := writeFile(t, "token", []byte("first"))
	opts, err := Config{TokenFile: path}.Options()
	if err != nil {
		t.Fatal(err)
	}
	if nc, err := nats.Connect(url, append(opts, nats.Timeout(2*time.Second))...); err == nil {
		nc.Close()
		t.Fatal("connected with the first token")
	}
	if err := os.WriteFile(path, []byte("second"), 0o600); err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(url, append(opts, nats.Timeout(2*time.Second))...)
	if err != nil {
		t.Fatalf("the rewritten token was not sent: %v", err)
	}
	nc.Close()
}

// A client with an inbox prefix of its own receives its replies there, and
// so works on a server that lets it subscribe to that prefix alone.
func TestAnInboxPrefixIsWhereTheRepliesCome(t *testing.T) {
	t.Parallel()
	url := startServer(t, &server.Options{Users: []*server.User{
		{Username: "client", Password: "p", Permissions: &server.Permissions{
			Publish:   &server.SubjectPermission{Allow: []string{"svc"}},
			Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX_mine.>"}},
		}},
		{Username: "server", Password: "p"},
	}})
	svc, err := nats.Connect(url, nats.UserInfo("server", "p"))
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	subjects := make(chan string, 1)
	if _, err := svc.Subscribe("svc", func(m *nats.Msg) { subjects <- m.Reply; _ = m.Respond([]byte("ok")) }); err != nil {
		t.Fatal(err)
	}
	if err := svc.Flush(); err != nil {
		t.Fatal(err)
	}
	opts, err := Config{User: "client", Password: "p", InboxPrefix: "_INBOX_mine"}.Options()
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if _, err := nc.Request("svc", nil, 5*time.Second); err != nil {
		t.Fatalf("a request through the client's own inbox: %v", err)
	}
	if reply := <-subjects; len(reply) < len("_INBOX_mine.") || reply[:len("_INBOX_mine.")] != "_INBOX_mine." {
		t.Errorf("the reply went to %s", reply)
	}
}
