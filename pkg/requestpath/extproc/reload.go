package extproc

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
)

// reloadEvery bounds how often a handshake looks at the files again.
const reloadEvery = time.Second

// ErrNoClientCA: the client CA file holds no certificate.
var ErrNoClientCA = errors.New("no CA certificate in the client CA file")

// tlsFiles gives each TLS handshake the server's configuration as its
// files say now: the key pair (or the certificate made at start when there
// are none) and, for mutual TLS, the CA that signs the clients allowed to
// ask for picks. Kubernetes updates a mounted Secret in place, so a file
// whose size or modification time changed is read again, at most once per
// reloadEvery; a file that does not load leaves the last good
// configuration in use.
type tlsFiles struct {
	cert, key, clientCA string
	made                tls.Certificate // when cert and key are empty

	reloads *prometheus.CounterVec
	log     *slog.Logger
	logs    *rate.Limiter

	mu      sync.Mutex
	checked time.Time
	stamp   string
	cfg     *tls.Config
}

func newTLSFiles(o Options, reloads *prometheus.CounterVec, log *slog.Logger) (*tlsFiles, error) {
	f := &tlsFiles{cert: o.CertFile, key: o.KeyFile, clientCA: o.ClientCAFile, reloads: reloads, log: log,
		logs: rate.NewLimiter(rate.Every(time.Minute), 1)}
	if f.cert == "" && f.key == "" {
		made, err := loadOrMakeCert("", "")
		if err != nil {
			return nil, err
		}
		f.made = made
	}
	// The first load must succeed: a server that cannot serve TLS should
	// not start.
	stamp := f.stampNow()
	cfg, err := f.load()
	if err != nil {
		return nil, err
	}
	f.cfg, f.stamp, f.checked = cfg, stamp, time.Now()
	return f, nil
}

// serverConfig is what the gRPC server is given: every handshake asks
// forConfig for the configuration of the moment.
func (f *tlsFiles) serverConfig() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, GetConfigForClient: f.forClient}
}

func (f *tlsFiles) forClient(*tls.ClientHelloInfo) (*tls.Config, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if now := time.Now(); now.Sub(f.checked) >= reloadEvery {
		f.checked = now
		if stamp := f.stampNow(); stamp != f.stamp {
			cfg, err := f.load()
			if err != nil {
				f.reloads.WithLabelValues("error").Inc()
				if f.logs.Allow() {
					f.log.Warn("ext_proc TLS files changed but do not load; serving the previous ones", "err", err)
				}
			} else {
				f.reloads.WithLabelValues("ok").Inc()
				f.cfg, f.stamp = cfg, stamp
			}
		}
	}
	return f.cfg, nil
}

// stampNow sums up the files' state; a change in any changes it.
func (f *tlsFiles) stampNow() string {
	var s string
	for _, p := range []string{f.cert, f.key, f.clientCA} {
		if p == "" {
			continue
		}
		if fi, err := os.Stat(p); err == nil {
			s += fmt.Sprintf("%s:%d:%d;", p, fi.Size(), fi.ModTime().UnixNano())
		} else {
			s += p + ":missing;"
		}
	}
	return s
}

func (f *tlsFiles) load() (*tls.Config, error) {
	cert := f.made
	if f.cert != "" || f.key != "" {
		var err error
		if cert, err = loadOrMakeCert(f.cert, f.key); err != nil {
			return nil, err
		}
	}
	cfg := &tls.Config{
		Certificates: []tls.Certificate{cert},
		MinVersion:   tls.VersionTLS12,
		// gRPC speaks HTTP/2 only; a configuration handed out per
		// handshake must say so itself.
		NextProtos: []string{"h2"},
	}
	if f.clientCA != "" {
		pem, err := os.ReadFile(f.clientCA)
		if err != nil {
			return nil, fmt.Errorf("client CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("client CA %s: %w", f.clientCA, ErrNoClientCA)
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}
