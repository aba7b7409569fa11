package natscallout

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/nats-io/nkeys"
	"golang.org/x/crypto/bcrypt"
)

// The files GenerateKeys writes into its directory: the NATS server
// includes ConfFile; the callout reads the other two.
const (
	// ConfFile defines the variables the server's configuration uses:
	// KVROUTE_CALLOUT_ISSUER (the account key users must be signed with)
	// and KVROUTE_CALLOUT_PASSWORD (the bcrypt hash of the callout's own
	// NATS password).
	ConfFile = "callout.conf"
	// IssuerSeedFile holds the account seed that signs the users.
	IssuerSeedFile = "issuer.seed"
	// PasswordFile holds the callout's NATS password.
	PasswordFile = "password"
)

// AuthUser is the NATS user the callout connects as; the server's
// auth_callout block lists it in auth_users, so that it bypasses the
// callout it serves.
const AuthUser = "kvroute-auth"

// ErrKeys: the key files are missing or do not hold what they should.
var ErrKeys = errors.New("callout keys")

// GenerateKeys writes a fresh issuer key and callout password into dir.
// The chart runs it as the NATS pod's init container into an in-memory
// volume the server and the callout share: the keys never leave the pod,
// and a new pod makes new ones, so no Secret has to be made or rotated.
func GenerateKeys(dir string) error {
	kp, err := nkeys.CreateAccount()
	if err != nil {
		return fmt.Errorf("%w: create issuer: %w", ErrKeys, err)
	}
	seed, err := kp.Seed()
	if err != nil {
		return fmt.Errorf("%w: %w", ErrKeys, err)
	}
	pub, err := kp.PublicKey()
	if err != nil {
		return fmt.Errorf("%w: %w", ErrKeys, err)
	}
	raw := make([]byte, 24)
	if _, err := rand.Read(raw); err != nil {
		return fmt.Errorf("%w: password: %w", ErrKeys, err)
	}
	password := base64.RawURLEncoding.EncodeToString(raw)
	// The password is 192 random bits, out of reach of guessing whatever
	// the cost; the lowest cost keeps the server's check at each of the
	// callout's (re)connects cheap.
	hash, err := bcrypt.GenerateFromPassword([]byte(password), bcrypt.MinCost)
	if err != nil {
		return fmt.Errorf("%w: hash password: %w", ErrKeys, err)
	}
	conf := fmt.Sprintf("# Written by kv-nats-auth init when the pod started; included by nats.conf.\nKVROUTE_CALLOUT_ISSUER: %q\nKVROUTE_CALLOUT_PASSWORD: %q\n", pub, hash)
	for _, f := range []struct {
		name string
		data []byte
	}{{IssuerSeedFile, seed}, {PasswordFile, []byte(password)}, {ConfFile, []byte(conf)}} {
		if err := writeFile(filepath.Join(dir, f.name), f.data); err != nil {
			return fmt.Errorf("%w: %w", ErrKeys, err)
		}
	}
	return nil
}

// writeFile replaces path whole, readable by the owner and its group (the
// NATS server's container shares the pod's group).
func writeFile(path string, data []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o640); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// LoadKeys reads what GenerateKeys wrote: the issuer and the password.
func LoadKeys(dir string) (nkeys.KeyPair, string, error) {
	seed, err := os.ReadFile(filepath.Join(dir, IssuerSeedFile))
	if err != nil {
		return nil, "", fmt.Errorf("%w: %w", ErrKeys, err)
	}
	kp, err := nkeys.FromSeed([]byte(strings.TrimSpace(string(seed))))
	if err != nil {
		return nil, "", fmt.Errorf("%w: issuer seed: %w", ErrKeys, err)
	}
	if pub, err := kp.PublicKey(); err != nil || !nkeys.IsValidPublicAccountKey(pub) {
		return nil, "", fmt.Errorf("%w: the issuer seed is not an account key", ErrKeys)
	}
	pw, err := os.ReadFile(filepath.Join(dir, PasswordFile))
	if err != nil {
		return nil, "", fmt.Errorf("%w: %w", ErrKeys, err)
	}
	password := strings.TrimSpace(string(pw))
	if password == "" {
		return nil, "", fmt.Errorf("%w: the password file is empty", ErrKeys)
	}
	return kp, password, nil
}
