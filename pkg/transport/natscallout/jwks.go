package natscallout

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"
	"k8s.io/client-go/rest"
)

// Errors of a signature check; each is the denial reason bad_signature,
// but ErrNoKeys, which is keys_unavailable.
var (
	// ErrBadSignature: the token is not signed by a key of the API
	// server's key set, or not in a way the API server signs.
	ErrBadSignature = errors.New("bad token signature")
	// ErrNoKeys: the API server's key set has never been read.
	ErrNoKeys = errors.New("service-account keys unavailable")
	// ErrMalformedKeySet: the key set is not a JWKS this callout can use.
	ErrMalformedKeySet = errors.New("malformed key set")
)

// JWKSPath is where the API server serves the public keys of its
// service-account issuer (OIDC discovery); the ClusterRole
// system:service-account-issuer-discovery grants reading it.
const JWKSPath = "/openid/v1/jwks"

// Bounds on a key set read from the network: the API server's holds one
// key per signing key in rotation, a few KiB.
const (
	maxJWKSBytes = 1 << 20
	maxJWKSKeys  = 64
	maxKIDBytes  = 256
)

// SignatureVerifier checks that a token was signed by the API server.
type SignatureVerifier interface {
	Verify(ctx context.Context, token string) error
}

// ParseJWKS reads a JSON Web Key Set and returns its signing keys by key
// ID. It keeps the RSA (2048 to 8192 bits) and EC (P-256, P-384, P-521)
// keys meant for signatures and refuses a set with none, or with
// malformed ones of those types; keys of other types are skipped, since
// the API server never signs with them.
func ParseJWKS(b []byte) (map[string]crypto.PublicKey, error) {
	if len(b) > maxJWKSBytes {
		return nil, fmt.Errorf("%w: %d bytes", ErrMalformedKeySet, len(b))
	}
	var set struct {
		Keys []struct {
			Kty string `json:"kty"`
			Kid string `json:"kid"`
			Use string `json:"use"`
			Alg string `json:"alg"`
			N   string `json:"n"`
			E   string `json:"e"`
			Crv string `json:"crv"`
			X   string `json:"x"`
			Y   string `json:"y"`
		} `json:"keys"`
	}
	d := json.NewDecoder(bytes.NewReader(b))
	if err := d.Decode(&set); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrMalformedKeySet, err)
	}
	if d.More() {
		return nil, fmt.Errorf("%w: trailing data", ErrMalformedKeySet)
	}
	if len(set.Keys) > maxJWKSKeys {
		return nil, fmt.Errorf("%w: %d keys", ErrMalformedKeySet, len(set.Keys))
	}
	keys := make(map[string]crypto.PublicKey, len(set.Keys))
	for i, k := range set.Keys {
		if k.Use != "" && k.Use != "sig" {
			continue
		}
		if k.Kid == "" || len(k.Kid) > maxKIDBytes {
			return nil, fmt.Errorf("%w: key %d has no usable kid", ErrMalformedKeySet, i)
		}
		if _, dup := keys[k.Kid]; dup {
			return nil, fmt.Errorf("%w: kid %q twice", ErrMalformedKeySet, truncate(k.Kid))
		}
		var (
			pub crypto.PublicKey
			err error
		)
		switch k.Kty {
		case "RSA":
			pub, err = rsaKey(k.N, k.E)
		case "EC":
			pub, err = ecKey(k.Crv, k.X, k.Y)
		default:
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("%w: key %q: %w", ErrMalformedKeySet, truncate(k.Kid), err)
		}
		keys[k.Kid] = pub
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("%w: no signing key", ErrMalformedKeySet)
	}
	return keys, nil
}

func rsaKey(n64, e64 string) (*rsa.PublicKey, error) {
	n, err := base64.RawURLEncoding.DecodeString(n64)
	if err != nil {
		return nil, fmt.Errorf("n: %w", err)
	}
	e, err := base64.RawURLEncoding.DecodeString(e64)
	if err != nil {
		return nil, fmt.Errorf("e: %w", err)
	}
	mod := new(big.Int).SetBytes(n)
	if bits := mod.BitLen(); bits < 2048 || bits > 8192 {
		return nil, fmt.Errorf("a modulus of %d bits", bits)
	}
	exp := new(big.Int).SetBytes(e)
	if !exp.IsInt64() || exp.Int64() < 3 || exp.Int64() > 1<<31-1 || exp.Bit(0) == 0 {
		return nil, errors.New("an exponent out of range")
	}
	return &rsa.PublicKey{N: mod, E: int(exp.Int64())}, nil
}

func ecKey(crv, x64, y64 string) (*ecdsa.PublicKey, error) {
	var curve elliptic.Curve
	switch crv {
	case "P-256":
		curve = elliptic.P256()
	case "P-384":
		curve = elliptic.P384()
	case "P-521":
		curve = elliptic.P521()
	default:
		return nil, fmt.Errorf("curve %q", truncate(crv))
	}
	size := (curve.Params().BitSize + 7) / 8
	x, err := base64.RawURLEncoding.DecodeString(x64)
	if err != nil || len(x) != size {
		return nil, errors.New("x is not a coordinate of the curve's size")
	}
	y, err := base64.RawURLEncoding.DecodeString(y64)
	if err != nil || len(y) != size {
		return nil, errors.New("y is not a coordinate of the curve's size")
	}
	// ParseUncompressedPublicKey refuses a point off the curve.
	return ecdsa.ParseUncompressedPublicKey(curve, append(append([]byte{4}, x...), y...))
}

// VerifySignature checks token's signature against keys, by the key its
// header names (kid) and with the algorithm that key's type and size
// require: RS256 for RSA, ES256, ES384 or ES512 for the EC curves, as the
// API server signs. Anything else is ErrBadSignature.
func VerifySignature(token string, keys map[string]crypto.PublicKey) error {
	if len(token) > maxTokenBytes {
		return fmt.Errorf("%w: %d bytes", ErrBadSignature, len(token))
	}
	signed, sig64, ok := cutLast(token)
	head, _, ok2 := strings.Cut(signed, ".")
	if !ok || !ok2 {
		return fmt.Errorf("%w: not a JWT", ErrBadSignature)
	}
	var hdr struct {
		Alg string `json:"alg"`
		Kid string `json:"kid"`
	}
	if err := decodePart(head, &hdr); err != nil {
		return fmt.Errorf("%w: header: %w", ErrBadSignature, err)
	}
	key, ok := keys[hdr.Kid]
	if !ok {
		return fmt.Errorf("%w: %w", ErrBadSignature, unknownKey(hdr.Kid))
	}
	sig, err := base64.RawURLEncoding.DecodeString(sig64)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrBadSignature, err)
	}
	switch k := key.(type) {
	case *rsa.PublicKey:
		if hdr.Alg != "RS256" {
			return fmt.Errorf("%w: alg %q for an RSA key", ErrBadSignature, truncate(hdr.Alg))
		}
		h := sha256.Sum256([]byte(signed))
		if rsa.VerifyPKCS1v15(k, crypto.SHA256, h[:], sig) != nil {
			return fmt.Errorf("%w: kid %q", ErrBadSignature, truncate(hdr.Kid))
		}
		return nil
	case *ecdsa.PublicKey:
		var want string
		var h []byte
		switch k.Curve {
		case elliptic.P256():
			s := sha256.Sum256([]byte(signed))
			want, h = "ES256", s[:]
		case elliptic.P384():
			s := sha512.Sum384([]byte(signed))
			want, h = "ES384", s[:]
		default:
			s := sha512.Sum512([]byte(signed))
			want, h = "ES512", s[:]
		}
		size := (k.Curve.Params().BitSize + 7) / 8
		if hdr.Alg != want || len(sig) != 2*size {
			return fmt.Errorf("%w: alg %q and %d signature bytes for a %s key", ErrBadSignature, truncate(hdr.Alg), len(sig), want)
		}
		// JWS signs with the raw r||s, not ASN.1.
		r, s := new(big.Int).SetBytes(sig[:size]), new(big.Int).SetBytes(sig[size:])
		if !ecdsa.Verify(k, h, r, s) {
			return fmt.Errorf("%w: kid %q", ErrBadSignature, truncate(hdr.Kid))
		}
		return nil
	}
	return fmt.Errorf("%w: a key of type %T", ErrBadSignature, key)
}

// cutLast splits a JWT into its signed part and its signature.
func cutLast(token string) (signed, sig string, ok bool) {
	i := strings.LastIndexByte(token, '.')
	if i < 0 {
		return "", "", false
	}
	return token[:i], token[i+1:], true
}

// errUnknownKey is a kid the key set lacks: worth a refresh, since the
// API server may have rotated its keys.
type errUnknownKey string

func (e errUnknownKey) Error() string { return fmt.Sprintf("no key %q", string(e)) }

func unknownKey(kid string) error { return errUnknownKey(truncate(kid)) }

// KeySetOptions configure a KeySet. Zero values mean the defaults.
type KeySetOptions struct {
	// Refresh is how often the key set is read again (default 5m).
	Refresh time.Duration
	// MinRefresh is the least time between two reads that a token of an
	// unknown kid asks for (default 10s): a storm of made-up kids costs
	// the API server one read per MinRefresh.
	MinRefresh time.Duration
	// Timeout bounds one read (default 5s).
	Timeout time.Duration
}

// KeySet verifies tokens against the API server's service-account keys,
// read from JWKSPath and kept: read again periodically, and when a token
// names a key it does not hold (the API server rotated its keys).
type KeySet struct {
	client rest.Interface
	o      KeySetOptions
	reads  *rate.Limiter

	mu   sync.RWMutex
	keys map[string]crypto.PublicKey
	// refreshing serialises reads, so that concurrent unknown kids wait
	// for one read instead of each starting their own; a channel, so that
	// a token's wait for another read ends with its own deadline.
	refreshing chan struct{}
}

var _ SignatureVerifier = (*KeySet)(nil)

// NewKeySet reads keys through client, a REST client of the API server
// (any group's: the path is absolute), authenticated as a subject that
// may read the issuer's discovery documents.
func NewKeySet(client rest.Interface, o KeySetOptions) *KeySet {
	if o.Refresh <= 0 {
		o.Refresh = 5 * time.Minute
	}
	if o.MinRefresh <= 0 {
		o.MinRefresh = 10 * time.Second
	}
	if o.Timeout <= 0 {
		o.Timeout = 5 * time.Second
	}
	return &KeySet{client: client, o: o, reads: rate.NewLimiter(rate.Every(o.MinRefresh), 1), refreshing: make(chan struct{}, 1)}
}

// Start reads the key set once, failing if it cannot, then rereads it
// every Refresh until ctx is done. A failed reread keeps the keys held.
func (s *KeySet) Start(ctx context.Context) error {
	if err := s.read(ctx); err != nil {
		return fmt.Errorf("service-account keys (%s; the callout needs the ClusterRole system:service-account-issuer-discovery): %w", JWKSPath, err)
	}
	go func() {
		t := time.NewTicker(s.o.Refresh)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				_ = s.read(ctx)
			}
		}
	}()
	return nil
}

// read fetches and parses the key set, and replaces the one held.
func (s *KeySet) read(ctx context.Context) error {
	select {
	case s.refreshing <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-s.refreshing }()
	rctx, cancel := context.WithTimeout(ctx, s.o.Timeout)
	defer cancel()
	body, err := s.client.Get().AbsPath(JWKSPath).Stream(rctx)
	if err != nil {
		return err
	}
	defer body.Close()
	b, err := io.ReadAll(io.LimitReader(body, maxJWKSBytes+1))
	if err != nil {
		return err
	}
	keys, err := ParseJWKS(b)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.keys = keys
	s.mu.Unlock()
	return nil
}

// Kids are the key IDs held, for tests and logs.
func (s *KeySet) Kids() []string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	kids := make([]string, 0, len(s.keys))
	for k := range s.keys {
		kids = append(kids, k)
	}
	return kids
}

// Verify checks token's signature. A kid the set lacks rereads it, at
// most once per MinRefresh, and checks again.
func (s *KeySet) Verify(ctx context.Context, token string) error {
	s.mu.RLock()
	keys := s.keys
	s.mu.RUnlock()
	if keys == nil {
		return ErrNoKeys
	}
	err := VerifySignature(token, keys)
	var unknown errUnknownKey
	if !errors.As(err, &unknown) || !s.reads.Allow() {
		return err
	}
	if rerr := s.read(ctx); rerr != nil {
		return fmt.Errorf("%w (reread: %v)", err, rerr)
	}
	s.mu.RLock()
	keys = s.keys
	s.mu.RUnlock()
	return VerifySignature(token, keys)
}
