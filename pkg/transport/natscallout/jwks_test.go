package natscallout

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kvroute/kvroute/pkg/testkit"
)

// Signing keys of the kinds the API server uses, made once.
var (
	rsaKey1 = mustRSA()
	rsaKey2 = mustRSA()
	p256Key = mustEC(elliptic.P256())
	p384Key = mustEC(elliptic.P384())
)

func mustRSA() *rsa.PrivateKey {
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		panic(err)
	}
	return k
}

func mustEC(c elliptic.Curve) *ecdsa.PrivateKey {
	k, err := ecdsa.GenerateKey(c, rand.Reader)
	if err != nil {
		panic(err)
	}
	return k
}

func b64(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }

// jwk is key's public half as a JWKS entry.
func jwk(kid string, key crypto.Signer) map[string]any {
	switch k := key.Public().(type) {
	case *rsa.PublicKey:
		return map[string]any{"kty": "RSA", "kid": kid, "use": "sig", "alg": "RS256",
			"n": b64(k.N.Bytes()), "e": b64([]byte{1, 0, 1})}
	case *ecdsa.PublicKey:
		size := (k.Curve.Params().BitSize + 7) / 8
		raw, err := k.Bytes()
		if err != nil {
			panic(err)
		}
		return map[string]any{"kty": "EC", "kid": kid, "use": "sig", "crv": k.Curve.Params().Name,
			"x": b64(raw[1 : 1+size]), "y": b64(raw[1+size:])}
	}
	panic(fmt.Sprintf("%T", key))
}

func jwksOf(t testing.TB, keys ...map[string]any) []byte {
	t.Helper()
	b, err := json.Marshal(map[string]any{"keys": keys})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// sign is a JWT of claims signed by key under kid with alg, as the API
// server signs its tokens.
func sign(t testing.TB, key crypto.Signer, kid, alg string, claims any) string {
	t.Helper()
	hdr, _ := json.Marshal(map[string]any{"alg": alg, "kid": kid})
	body, err := json.Marshal(claims)
	if err != nil {
		t.Fatal(err)
	}
	signed := b64(hdr) + "." + b64(body)
	var sig []byte
	switch k := key.(type) {
	case *rsa.PrivateKey:
		h := sha256.Sum256([]byte(signed))
		sig, err = rsa.SignPKCS1v15(rand.Reader, k, crypto.SHA256, h[:])
	case *ecdsa.PrivateKey:
		var hh hash.Hash = sha256.New()
		if k.Curve == elliptic.P384() {
			hh = sha512.New384()
		}
		hh.Write([]byte(signed))
		r, s, serr := ecdsa.Sign(rand.Reader, k, hh.Sum(nil))
		size := (k.Curve.Params().BitSize + 7) / 8
		sig, err = append(r.FillBytes(make([]byte, size)), s.FillBytes(make([]byte, size))...), serr
	}
	if err != nil {
		t.Fatal(err)
	}
	return signed + "." + b64(sig)
}

func TestParseJWKSKeepsTheSigningKeysAndRefusesMalformedOnes(t *testing.T) {
	t.Parallel()
	keys, err := ParseJWKS(jwksOf(t, jwk("r", rsaKey1), jwk("e", p256Key), jwk("e384", p384Key),
		map[string]any{"kty": "OKP", "kid": "x", "crv": "X25519", "x": "AA"},
		map[string]any{"kty": "RSA", "kid": "enc", "use": "enc", "n": "AA", "e": "AQAB"}))
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 3 || keys["r"] == nil || keys["e"] == nil || keys["e384"] == nil {
		t.Fatalf("keys %v, want r, e and e384", keys)
	}
	small := mustSmallRSA(t)
	offCurve := jwk("e", p256Key)
	offCurve["y"] = offCurve["x"]
	shortX := jwk("e", p256Key)
	shortX["x"] = b64([]byte{1, 2, 3})
	evenE := jwk("r", rsaKey1)
	evenE["e"] = b64([]byte{4})
	noKid := jwk("", rsaKey1)
	for _, tt := range []struct {
		name string
		set  []byte
	}{
		{"not JSON", []byte("{")},
		{"trailing data", append(jwksOf(t, jwk("r", rsaKey1)), []byte(" {}")...)},
		{"no keys", []byte(`{"keys":[]}`)},
		{"only keys of other types", jwksOf(t, map[string]any{"kty": "oct", "kid": "h", "k": "AA"})},
		{"a key without a kid", jwksOf(t, noKid)},
		{"one kid twice", jwksOf(t, jwk("r", rsaKey1), jwk("r", rsaKey2))},
		{"an RSA modulus under 2048 bits", jwksOf(t, jwk("s", small))},
		{"an even RSA exponent", jwksOf(t, evenE)},
		{"an EC point off its curve", jwksOf(t, offCurve)},
		{"an EC coordinate of the wrong size", jwksOf(t, shortX)},
		{"an unknown curve", jwksOf(t, map[string]any{"kty": "EC", "kid": "e", "crv": "P-192", "x": "AA", "y": "AA"})},
		{"more than 64 keys", jwksOf(t, manyKeys(65)...)},
		{"more than 1 MiB", []byte(`{"keys":[],"pad":"` + strings.Repeat("a", maxJWKSBytes) + `"}`)},
	} {
		if _, err := ParseJWKS(tt.set); !errors.Is(err, ErrMalformedKeySet) {
			t.Errorf("%s: %v, want ErrMalformedKeySet", tt.name, err)
		}
	}
}

func mustSmallRSA(t *testing.T) *rsa.PrivateKey {
	t.Helper()
	// GenerateKey refuses sizes under 1024 bits; 1024 is still too small
	// to sign tokens with.
	k, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func manyKeys(n int) []map[string]any {
	out := make([]map[string]any, n)
	for i := range out {
		out[i] = jwk(fmt.Sprint(i), p256Key)
	}
	return out
}

func TestVerifySignatureAcceptsOnlyTheAPIServersSignatures(t *testing.T) {
	t.Parallel()
	keys, err := ParseJWKS(jwksOf(t, jwk("r", rsaKey1), jwk("e", p256Key), jwk("e384", p384Key)))
	if err != nil {
		t.Fatal(err)
	}
	claims := podClaims(epoch.Add(time.Hour))
	good := sign(t, rsaKey1, "r", "RS256", claims)
	for _, tok := range []string{good, sign(t, p256Key, "e", "ES256", claims), sign(t, p384Key, "e384", "ES384", claims)} {
		if err := VerifySignature(tok, keys); err != nil {
			t.Errorf("a valid signature refused: %v", err)
		}
	}
	parts := strings.Split(good, ".")
	other := podClaims(epoch.Add(48 * time.Hour))
	otherBody, _ := json.Marshal(other)
	hs := sign(t, rsaKey1, "r", "RS256", claims)
	hsHdr, _ := json.Marshal(map[string]any{"alg": "HS256", "kid": "r"})
	for _, tt := range []struct{ name, token string }{
		{"signed by another RSA key under the right kid", sign(t, rsaKey2, "r", "RS256", claims)},
		{"signed by another key under a kid the set lacks", sign(t, rsaKey2, "r2", "RS256", claims)},
		{"with claims changed after signing", parts[0] + "." + b64(otherBody) + "." + parts[2]},
		{"with its signature cut off", parts[0] + "." + parts[1] + "."},
		{"with no signature part", parts[0] + "." + parts[1]},
		{"an RSA signature under an EC key's kid", sign(t, rsaKey1, "e", "RS256", claims)},
		{"an ES256 header on an RSA key", sign(t, p256Key, "r", "ES256", claims)},
		{"an HS256 header on an RSA key", b64(hsHdr) + "." + parts[1] + "." + strings.Split(hs, ".")[2]},
		{"alg none", b64([]byte(`{"alg":"none","kid":"r"}`)) + "." + parts[1] + "."},
		{"an ES384 signature under a P-256 kid", sign(t, p384Key, "e", "ES384", claims)},
		{"a signature that is not base64url", good + "!"},
		{"a header that is not JSON", "e30x." + parts[1] + "." + parts[2]},
		{"no kid", b64([]byte(`{"alg":"RS256"}`)) + "." + parts[1] + "." + parts[2]},
		{"garbage", "a.b.c"},
		{"too large", strings.Repeat("a", maxTokenBytes+1)},
	} {
		if err := VerifySignature(tt.token, keys); !errors.Is(err, ErrBadSignature) {
			t.Errorf("%s: %v, want ErrBadSignature", tt.name, err)
		}
	}
}

// jwksServer is an API server's discovery endpoint on loopback, serving
// the set it is given and counting reads.
type jwksServer struct {
	mu    sync.Mutex
	set   []byte
	code  int
	reads atomic.Int64
	srv   *httptest.Server
	// block, when set, holds every read until it is closed.
	block chan struct{}
}

func startJWKSServer(t *testing.T, set []byte) *jwksServer {
	t.Helper()
	s := &jwksServer{set: set, code: http.StatusOK}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != JWKSPath {
			http.NotFound(w, r)
			return
		}
		s.reads.Add(1)
		s.mu.Lock()
		block := s.block
		s.mu.Unlock()
		if block != nil {
			select {
			case <-block:
			case <-r.Context().Done():
			}
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		w.Header().Set("Content-Type", "application/jwk-set+json")
		w.WriteHeader(s.code)
		_, _ = w.Write(s.set)
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *jwksServer) serve(code int, set []byte) {
	s.mu.Lock()
	s.code, s.set = code, set
	s.mu.Unlock()
}

func (s *jwksServer) client(t *testing.T) rest.Interface {
	t.Helper()
	cs, err := kubernetes.NewForConfig(&rest.Config{Host: s.srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	return cs.Discovery().RESTClient()
}

// The API server rotates its keys: a token of the new key rereads the
// set and passes; made-up kids reread it at most once per MinRefresh.
func TestAKeySetRereadsForANewKeyAndNotForEveryMadeUpOne(t *testing.T) {
	t.Parallel()
	srv := startJWKSServer(t, jwksOf(t, jwk("k1", rsaKey1)))
	ks := NewKeySet(srv.client(t), KeySetOptions{Refresh: time.Hour, MinRefresh: time.Hour})
	ctx := t.Context()
	if err := ks.Verify(ctx, sign(t, rsaKey1, "k1", "RS256", podClaims(epoch))); !errors.Is(err, ErrNoKeys) {
		t.Fatalf("before the first read: %v, want ErrNoKeys", err)
	}
	if err := ks.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := ks.Verify(ctx, sign(t, rsaKey1, "k1", "RS256", podClaims(epoch))); err != nil {
		t.Fatalf("a token of the key read: %v", err)
	}
	srv.serve(http.StatusOK, jwksOf(t, jwk("k1", rsaKey1), jwk("k2", rsaKey2)))
	if err := ks.Verify(ctx, sign(t, rsaKey2, "k2", "RS256", podClaims(epoch))); err != nil {
		t.Fatalf("a token of the rotated-in key: %v", err)
	}
	reads := srv.reads.Load()
	if reads != 2 {
		t.Fatalf("%d reads, want the first and the rotation's", reads)
	}
	var wg sync.WaitGroup
	for i := range 100 {
		wg.Go(func() {
			if err := ks.Verify(ctx, sign(t, rsaKey2, fmt.Sprint("made-up-", i), "RS256", podClaims(epoch))); !errors.Is(err, ErrBadSignature) {
				t.Errorf("a made-up kid: %v", err)
			}
		})
	}
	wg.Wait()
	if got := srv.reads.Load(); got != reads {
		t.Errorf("%d reads after 100 made-up kids, want %d", got, reads)
	}
}

// A reread that hangs holds no other token past that token's own
// deadline, which the callout keeps within the server's authorization
// timeout.
func TestAKeySetRereadWaitsNoLongerThanTheTokensDeadline(t *testing.T) {
	t.Parallel()
	srv := startJWKSServer(t, jwksOf(t, jwk("k1", rsaKey1)))
	ks := NewKeySet(srv.client(t), KeySetOptions{Refresh: time.Hour, MinRefresh: time.Nanosecond, Timeout: time.Hour})
	if err := ks.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	srv.mu.Lock()
	srv.block = release
	srv.mu.Unlock()
	hung, stop := context.WithCancel(t.Context())
	t.Cleanup(func() { stop(); close(release) })
	first, second := sign(t, rsaKey2, "k2", "RS256", podClaims(epoch)), sign(t, rsaKey2, "k3", "RS256", podClaims(epoch))
	go func() { _ = ks.Verify(hung, first) }()
	testkit.WaitFor(t, "a reread to hang", func() error {
		if n := srv.reads.Load(); n < 2 {
			return fmt.Errorf("%d reads, want the start's and a hanging one", n)
		}
		return nil
	})
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- ks.Verify(ctx, second) }()
	var err error
	testkit.WaitFor(t, "a token waiting for the hung reread to give up at its deadline", func() error {
		select {
		case err = <-done:
			return nil
		default:
			return errors.New("still waiting")
		}
	})
	if !errors.Is(err, ErrBadSignature) {
		t.Fatalf("a token of an unknown kid whose reread could not run: %v, want ErrBadSignature", err)
	}
}

// A set that cannot be read fails Start, saying which role is missing; a
// set read once is kept through failed rereads and replaced by good ones.
func TestAKeySetIsKeptThroughFailedRereads(t *testing.T) {
	t.Parallel()
	srv := startJWKSServer(t, nil)
	srv.serve(http.StatusForbidden, []byte(`{"kind":"Status","status":"Failure","reason":"Forbidden","code":403}`))
	ks := NewKeySet(srv.client(t), KeySetOptions{Refresh: 10 * time.Millisecond})
	ctx := t.Context()
	if err := ks.Start(ctx); err == nil || !strings.Contains(err.Error(), "system:service-account-issuer-discovery") {
		t.Fatalf("start against a forbidden key set: %v", err)
	}
	srv.serve(http.StatusOK, []byte(`{"keys":[],"pad":"`+strings.Repeat("a", maxJWKSBytes)+`"}`))
	if err := ks.Start(ctx); !errors.Is(err, ErrMalformedKeySet) {
		t.Fatalf("start against an oversized key set: %v", err)
	}
	srv.serve(http.StatusOK, jwksOf(t, jwk("k1", rsaKey1)))
	if err := ks.Start(ctx); err != nil {
		t.Fatal(err)
	}
	srv.serve(http.StatusInternalServerError, []byte("broken"))
	before := srv.reads.Load()
	testkit.WaitFor(t, "failed periodic rereads", func() error {
		if n := srv.reads.Load() - before; n < 3 {
			return fmt.Errorf("%d rereads", n)
		}
		return nil
	})
	if err := ks.Verify(ctx, sign(t, rsaKey1, "k1", "RS256", podClaims(epoch))); err != nil {
		t.Fatalf("the keys read before were dropped: %v", err)
	}
	srv.serve(http.StatusOK, jwksOf(t, jwk("k2", rsaKey2)))
	testkit.WaitFor(t, "a periodic reread to replace the set", func() error {
		if kids := ks.Kids(); len(kids) != 1 || kids[0] != "k2" {
			return fmt.Errorf("kids %v", kids)
		}
		return nil
	})
}

// The key set comes from the network: no input may panic the parser,
// and every key it keeps is one VerifySignature can use.
func FuzzParseJWKS(f *testing.F) {
	f.Add(jwksOf(f, jwk("r", rsaKey1), jwk("e", p256Key)))
	f.Add(jwksOf(f, jwk("e384", p384Key)))
	f.Add([]byte(`{"keys":[{"kty":"EC","kid":"e","crv":"P-256","x":"AA","y":"AA"}]}`))
	f.Add([]byte(`{"keys":[{"kty":"RSA","kid":"r","n":"AQAB","e":"AQAB"}]}`))
	f.Add([]byte(`{}`))
	token := sign(f, rsaKey1, "r", "RS256", podClaims(epoch))
	f.Fuzz(func(t *testing.T, set []byte) {
		keys, err := ParseJWKS(set)
		if err != nil {
			if !errors.Is(err, ErrMalformedKeySet) {
				t.Fatalf("%v is not ErrMalformedKeySet", err)
			}
			return
		}
		if len(keys) == 0 || len(keys) > maxJWKSKeys {
			t.Fatalf("%d keys accepted", len(keys))
		}
		for kid, k := range keys {
			switch k.(type) {
			case *rsa.PublicKey, *ecdsa.PublicKey:
			default:
				t.Fatalf("key %q of type %T", kid, k)
			}
		}
		if err := VerifySignature(token, keys); err != nil && !errors.Is(err, ErrBadSignature) {
			t.Fatalf("verify: %v", err)
		}
	})
}
