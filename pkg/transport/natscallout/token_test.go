package natscallout

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
)

// jwtOf is an unsigned-looking but well-formed token: header, claims and a
// made-up signature, as a forger would send.
func jwtOf(t testing.TB, header, claims any) string {
	t.Helper()
	part := func(v any) string {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return base64.RawURLEncoding.EncodeToString(b)
	}
	return part(header) + "." + part(claims) + "." + base64.RawURLEncoding.EncodeToString([]byte("signature"))
}

var epoch = time.Unix(1_800_000_000, 0)

func podClaims(exp time.Time) map[string]any {
	return map[string]any{
		"iss": "https://kubernetes.default.svc", "aud": []string{"kvroute-nats"},
		"exp": exp.Unix(), "nbf": epoch.Add(-time.Minute).Unix(),
		"kubernetes.io": map[string]any{
			"namespace":      "llm",
			"pod":            map[string]any{"name": "vllm-0", "uid": "u-1"},
			"serviceaccount": map[string]any{"name": "kv-relay", "uid": "s-1"},
		},
	}
}

func TestParseTokenReadsAProjectedTokensClaims(t *testing.T) {
	t.Parallel()
	c, err := ParseToken(jwtOf(t, map[string]any{"alg": "RS256", "kid": "k"}, podClaims(epoch.Add(time.Hour))))
	if err != nil {
		t.Fatal(err)
	}
	want := Claims{Issuer: "https://kubernetes.default.svc", Audiences: []string{"kvroute-nats"},
		Expiry: epoch.Add(time.Hour), NotBefore: epoch.Add(-time.Minute),
		Namespace: "llm", ServiceAccount: "kv-relay", Pod: "vllm-0", PodUID: "u-1"}
	if c.Issuer != want.Issuer || strings.Join(c.Audiences, ",") != "kvroute-nats" || !c.Expiry.Equal(want.Expiry) ||
		!c.NotBefore.Equal(want.NotBefore) || c.Namespace != want.Namespace || c.ServiceAccount != want.ServiceAccount ||
		c.Pod != want.Pod || c.PodUID != want.PodUID {
		t.Fatalf("claims %+v, want %+v", c, want)
	}
	if err := c.Check(epoch, "https://kubernetes.default.svc", "kvroute-nats"); err != nil {
		t.Fatalf("a valid token fails the local checks: %v", err)
	}
	// One audience as a plain string, as some issuers write it.
	cl := podClaims(epoch.Add(time.Hour))
	cl["aud"] = "kvroute-nats"
	if c, err := ParseToken(jwtOf(t, map[string]any{"alg": "ES256"}, cl)); err != nil || c.Check(epoch, "", "kvroute-nats") != nil {
		t.Fatalf("a string aud: %+v, %v", c, err)
	}
}

func TestParseTokenRefusesWhatIsNoJWT(t *testing.T) {
	t.Parallel()
	good := podClaims(epoch.Add(time.Hour))
	noExp := podClaims(epoch)
	delete(noExp, "exp")
	hugeExp := podClaims(epoch)
	hugeExp["exp"] = 1e300
	for _, tt := range []struct{ name, token string }{
		{"an opaque token", "warm-up"},
		{"two parts", "eyJhbGciOiJSUzI1NiJ9.e30"},
		{"four parts", jwtOf(t, map[string]any{"alg": "RS256"}, good) + ".x"},
		{"no signature", strings.TrimSuffix(jwtOf(t, map[string]any{"alg": "RS256"}, good), base64.RawURLEncoding.EncodeToString([]byte("signature")))},
		{"alg none", jwtOf(t, map[string]any{"alg": "none"}, good)},
		{"no alg", jwtOf(t, map[string]any{"typ": "JWT"}, good)},
		{"claims that are not JSON", "eyJhbGciOiJSUzI1NiJ9.bm90IGpzb24.c2ln"},
		{"claims with trailing data", "eyJhbGciOiJSUzI1NiJ9." + base64.RawURLEncoding.EncodeToString([]byte(`{"exp":1} {}`)) + ".c2ln"},
		{"no exp", jwtOf(t, map[string]any{"alg": "RS256"}, noExp)},
		{"an exp out of range", jwtOf(t, map[string]any{"alg": "RS256"}, hugeExp)},
		{"bad base64", "eyJhbGciOiJSUzI1NiJ9.e30!.c2ln"},
		{"too large", "a." + strings.Repeat("b", maxTokenBytes) + ".c"},
	} {
		if c, err := ParseToken(tt.token); !errors.Is(err, ErrMalformedToken) {
			t.Errorf("%s: %+v, %v; want ErrMalformedToken", tt.name, c, err)
		}
	}
}

func TestClaimsCheckRefusesTokensNoReviewWouldPass(t *testing.T) {
	t.Parallel()
	c, err := ParseToken(jwtOf(t, map[string]any{"alg": "RS256"}, podClaims(epoch.Add(time.Hour))))
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name             string
		now              time.Time
		issuer, audience string
		ok               bool
	}{
		{"valid now", epoch, "https://kubernetes.default.svc", "kvroute-nats", true},
		{"issuer left unchecked", epoch, "", "kvroute-nats", true},
		{"expired a moment ago, within the clock skew", epoch.Add(time.Hour + 10*time.Second), "", "kvroute-nats", true},
		{"expired", epoch.Add(time.Hour + time.Minute), "", "kvroute-nats", false},
		{"not yet valid", epoch.Add(-5 * time.Minute), "", "kvroute-nats", false},
		{"another issuer", epoch, "https://oidc.example", "kvroute-nats", false},
		{"another audience", epoch, "", "https://kubernetes.default.svc", false},
	} {
		if err := c.Check(tt.now, tt.issuer, tt.audience); (err == nil) != tt.ok {
			t.Errorf("%s: %v, want ok=%t", tt.name, err, tt.ok)
		} else if err != nil && !errors.Is(err, ErrMalformedToken) {
			t.Errorf("%s: %v is not ErrMalformedToken", tt.name, err)
		}
	}
}

// The tokens a connect carries come from the network: no input may panic
// the parser or the signature check, and what they accept they accept
// consistently.
func FuzzParseToken(f *testing.F) {
	keys, err := ParseJWKS(jwksOf(f, jwk("r", rsaKey1), jwk("e", p256Key)))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(sign(f, rsaKey1, "r", "RS256", podClaims(epoch.Add(time.Hour))))
	f.Add(sign(f, p256Key, "e", "ES256", podClaims(epoch.Add(time.Hour))))
	f.Add(jwtOf(f, map[string]any{"alg": "RS256"}, podClaims(epoch.Add(time.Hour))))
	f.Add("eyJhbGciOiJSUzI1NiJ9.e30.c2ln")
	f.Add("eyJhbGciOiJSUzI1NiJ9.eyJleHAiOjEuNWUzMDB9.c2ln")
	f.Add("a.b.c")
	f.Add("")
	f.Fuzz(func(t *testing.T, token string) {
		verr := VerifySignature(token, keys)
		if verr != nil && !errors.Is(verr, ErrBadSignature) {
			t.Fatalf("%q: %v is not ErrBadSignature", token, verr)
		}
		if verr == nil && strings.Count(token, ".") != 2 {
			t.Fatalf("%q verified", token)
		}
		c, err := ParseToken(token)
		if err != nil {
			if !errors.Is(err, ErrMalformedToken) {
				t.Fatalf("%q: %v is not ErrMalformedToken", token, err)
			}
			return
		}
		if c.Expiry.IsZero() {
			t.Fatalf("%q accepted without an expiry", token)
		}
		if strings.Count(token, ".") != 2 || len(token) > maxTokenBytes {
			t.Fatalf("%q accepted", token)
		}
		_ = c.Check(epoch, "", DefaultAudience)
	})
}

func TestTheReviewCacheIsBoundedAndForgetsExpiredTokens(t *testing.T) {
	t.Parallel()
	c := newReviewCache(3)
	now := epoch
	for i, tok := range []string{"a", "b", "c"} {
		c.put(tok, Identity{Pod: tok}, now.Add(time.Duration(i+1)*time.Minute), now)
	}
	if id, ok := c.get("b", now); !ok || id.Pod != "b" {
		t.Fatalf("b: %+v %t", id, ok)
	}
	// Full: the one closest to its expiry (a) makes room.
	c.put("d", Identity{Pod: "d"}, now.Add(time.Hour), now)
	if c.len() != 3 {
		t.Fatalf("%d entries, want at most 3", c.len())
	}
	if _, ok := c.get("a", now); ok {
		t.Error("a kept past the bound")
	}
	if _, ok := c.get("d", now); !ok {
		t.Error("d not kept")
	}
	// Expired entries are not returned, and are dropped first.
	later := now.Add(150 * time.Second)
	if _, ok := c.get("b", later); ok {
		t.Error("b returned after its token expired")
	}
	c.put("e", Identity{}, later.Add(time.Minute), later)
	c.put("f", Identity{}, later.Add(time.Minute), later)
	if _, ok := c.get("d", later); !ok || c.len() != 3 {
		t.Errorf("d dropped instead of the expired c (%d entries)", c.len())
	}
	// A token already expired is not kept; one forgotten is gone.
	c.put("g", Identity{}, later, later)
	if _, ok := c.get("g", later); ok {
		t.Error("an expired token was cached")
	}
	c.forget("d")
	if _, ok := c.get("d", later); ok {
		t.Error("d not forgotten")
	}
	if n := newReviewCache(-1); func() bool { n.put("x", Identity{}, later.Add(time.Hour), later); return n.len() != 0 }() {
		t.Error("a disabled cache kept a token")
	}
}
