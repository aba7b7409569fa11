// Package natsauth turns the credential and TLS settings an operator gives
// a kvroute component (the EPP, tools) into NATS client options, so that
// every component reads them the same way and refuses the same mistakes.
package natsauth

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/nats-io/nats.go"
)

// ErrConfig is returned for settings that cannot describe a connection.
var ErrConfig = errors.New("invalid NATS credentials")

// Config says how a client proves who it is and checks the server. The zero
// value is an anonymous client without TLS beyond what the URL asks for.
type Config struct {
	// At most one way to authenticate: User and Password, Token, a token
	// file, an NKey seed file, or a creds file (a JWT and its NKey seed).
	User, Password string
	Token          string
	// TokenFile is read at every connect, so that a token the kubelet
	// refreshes (a projected ServiceAccount token, which the chart's NATS
	// auth callout verifies) is always the current one.
	TokenFile    string
	NKeySeedFile string
	CredsFile    string
	// CAFile verifies the server's certificate (and turns TLS on);
	// CertFile and KeyFile, both or neither, present the client's own.
	CAFile            string
	CertFile, KeyFile string
	// InboxPrefix replaces _INBOX as the prefix of the client's reply
	// subjects, so that a server can let it read its own replies only
	// (the chart's auth callout gives the EPP one of its own).
	InboxPrefix string
}

// Options returns the client options for c, or an error naming the
// mistake: two ways to authenticate, half a client certificate, or an NKey
// seed file that cannot be read.
func (c Config) Options() ([]nats.Option, error) {
	var opts []nats.Option
	auth := 0
	if c.User != "" || c.Password != "" {
		if c.User == "" {
			return nil, fmt.Errorf("%w: a password without a user", ErrConfig)
		}
		auth++
		opts = append(opts, nats.UserInfo(c.User, c.Password))
	}
	if c.Token != "" {
		auth++
		opts = append(opts, nats.Token(c.Token))
	}
	if c.TokenFile != "" {
		auth++
		if _, err := readToken(c.TokenFile); err != nil {
			return nil, fmt.Errorf("%w: token file: %w", ErrConfig, err)
		}
		path := c.TokenFile
		opts = append(opts, nats.TokenHandler(func() string {
			// A read that fails now sends no token: the server refuses the
			// connection, and the client tries again with the next read.
			tok, _ := readToken(path)
			return tok
		}))
	}
	if c.NKeySeedFile != "" {
		auth++
		opt, err := nats.NkeyOptionFromSeed(c.NKeySeedFile)
		if err != nil {
			return nil, fmt.Errorf("%w: nkey seed %s: %w", ErrConfig, c.NKeySeedFile, err)
		}
		opts = append(opts, opt)
	}
	if c.CredsFile != "" {
		auth++
		if _, err := os.Stat(c.CredsFile); err != nil {
			return nil, fmt.Errorf("%w: creds file: %w", ErrConfig, err)
		}
		opts = append(opts, nats.UserCredentials(c.CredsFile))
	}
	if auth > 1 {
		return nil, fmt.Errorf("%w: give one of user/password, token, token file, nkey seed, creds file", ErrConfig)
	}
	if (c.CertFile == "") != (c.KeyFile == "") {
		return nil, fmt.Errorf("%w: a client certificate needs both its cert and key files", ErrConfig)
	}
	if c.InboxPrefix != "" {
		if strings.ContainsAny(c.InboxPrefix, "*> \t") || strings.HasPrefix(c.InboxPrefix, ".") || strings.HasSuffix(c.InboxPrefix, ".") || strings.Contains(c.InboxPrefix, "..") {
			return nil, fmt.Errorf("%w: inbox prefix %q is not a literal subject", ErrConfig, c.InboxPrefix)
		}
		opts = append(opts, nats.CustomInboxPrefix(c.InboxPrefix))
	}
	if c.CAFile != "" {
		opts = append(opts, nats.RootCAs(c.CAFile))
	}
	if c.CertFile != "" {
		opts = append(opts, nats.ClientCert(c.CertFile, c.KeyFile))
	}
	return opts, nil
}

// RegisterFlags adds the --nats-* credential flags to fs, each defaulting
// to its environment variable, the way kv-relay reads them: secrets are
// better passed in the environment (from a Kubernetes Secret) than on a
// command line that ps shows.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.User, "nats-user", os.Getenv("NATS_USER"), "NATS user (NATS_USER)")
	fs.StringVar(&c.Password, "nats-password", os.Getenv("NATS_PASSWORD"), "NATS password (NATS_PASSWORD; prefer the environment to the flag)")
	fs.StringVar(&c.Token, "nats-token", os.Getenv("NATS_TOKEN"), "NATS token (NATS_TOKEN; prefer the environment to the flag)")
	fs.StringVar(&c.TokenFile, "nats-token-file", os.Getenv("NATS_TOKEN_FILE"), "file holding a NATS token, read at every connect: a projected ServiceAccount token (NATS_TOKEN_FILE)")
	fs.StringVar(&c.NKeySeedFile, "nats-nkey-seed", os.Getenv("NATS_NKEY_SEED_FILE"), "file holding an NKey seed (NATS_NKEY_SEED_FILE)")
	fs.StringVar(&c.CredsFile, "nats-creds", os.Getenv("NATS_CREDS_FILE"), "NATS creds file, a JWT and its seed (NATS_CREDS_FILE)")
	fs.StringVar(&c.CAFile, "nats-ca", os.Getenv("NATS_CA_FILE"), "CA bundle to verify the NATS server (NATS_CA_FILE)")
	fs.StringVar(&c.CertFile, "nats-cert", os.Getenv("NATS_CERT_FILE"), "client certificate for NATS TLS (NATS_CERT_FILE)")
	fs.StringVar(&c.KeyFile, "nats-key", os.Getenv("NATS_KEY_FILE"), "client key for NATS TLS (NATS_KEY_FILE)")
	fs.StringVar(&c.InboxPrefix, "nats-inbox-prefix", os.Getenv("NATS_INBOX_PREFIX"), "prefix of this client's reply subjects instead of _INBOX, for a server that grants each client its own (NATS_INBOX_PREFIX)")
}

// maxTokenBytes bounds a token file: a ServiceAccount token is a few KiB.
const maxTokenBytes = 64 << 10

// readToken reads a token file, its surrounding whitespace removed.
func readToken(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxTokenBytes+1))
	if err != nil {
		return "", err
	}
	if len(b) > maxTokenBytes {
		return "", fmt.Errorf("%s: more than %d bytes", path, maxTokenBytes)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", fmt.Errorf("%s is empty", path)
	}
	return tok, nil
}
