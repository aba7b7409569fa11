package natscallout

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// ErrMalformedToken: the token is not a ServiceAccount JWT this callout
// could accept, whatever the API server would say of it. Tokens refused
// with it never reach the TokenReview limiter.
var ErrMalformedToken = errors.New("malformed token")

// clockSkew is the leeway on exp and nbf: the API server and this pod's
// clocks may disagree by a few seconds.
const clockSkew = 30 * time.Second

// Claims are the parts of a projected ServiceAccount token the callout
// reads before any review. ParseToken does not verify the signature
// (VerifySignature does); together they are a filter that keeps tokens
// which cannot pass a TokenReview from spending the review budget, and
// the review remains the authority on revocation.
type Claims struct {
	Issuer    string
	Audiences []string
	Expiry    time.Time
	NotBefore time.Time
	// Namespace, ServiceAccount, Pod and PodUID are the token's
	// kubernetes.io claims; Pod and PodUID are empty for a token bound to
	// no pod.
	Namespace, ServiceAccount string
	Pod, PodUID               string
}

// audience is a JWT aud: one string or a list of them.
type audience []string

func (a *audience) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		*a = audience{s}
		return nil
	}
	var l []string
	if err := json.Unmarshal(b, &l); err != nil {
		return err
	}
	*a = l
	return nil
}

type rawClaims struct {
	Iss  string    `json:"iss"`
	Aud  audience  `json:"aud"`
	Exp  *jsonTime `json:"exp"`
	Nbf  *jsonTime `json:"nbf"`
	Kube *struct {
		Namespace string `json:"namespace"`
		Pod       *struct {
			Name string `json:"name"`
			UID  string `json:"uid"`
		} `json:"pod"`
		ServiceAccount *struct {
			Name string `json:"name"`
		} `json:"serviceaccount"`
	} `json:"kubernetes.io"`
}

// jsonTime is a NumericDate: seconds since the epoch, possibly fractional.
type jsonTime float64

// maxJWTTime keeps a NumericDate inside what time.Unix can hold.
const maxJWTTime = 1 << 40

// ParseToken reads a ServiceAccount JWT's claims without verifying its
// signature. It refuses anything that is not three base64url parts with
// a JSON header naming a signing algorithm and JSON claims with an exp.
func ParseToken(token string) (Claims, error) {
	if len(token) > maxTokenBytes {
		return Claims{}, fmt.Errorf("%w: %d bytes", ErrMalformedToken, len(token))
	}
	head, rest, ok := strings.Cut(token, ".")
	payload, sig, ok2 := strings.Cut(rest, ".")
	if !ok || !ok2 || head == "" || payload == "" || sig == "" || strings.Contains(sig, ".") {
		return Claims{}, fmt.Errorf("%w: not a JWT", ErrMalformedToken)
	}
	var hdr struct {
		Alg string `json:"alg"`
	}
	if err := decodePart(head, &hdr); err != nil {
		return Claims{}, fmt.Errorf("%w: header: %w", ErrMalformedToken, err)
	}
	if hdr.Alg == "" || strings.EqualFold(hdr.Alg, "none") {
		return Claims{}, fmt.Errorf("%w: unsigned", ErrMalformedToken)
	}
	if _, err := base64.RawURLEncoding.DecodeString(sig); err != nil {
		return Claims{}, fmt.Errorf("%w: signature: %w", ErrMalformedToken, err)
	}
	var raw rawClaims
	if err := decodePart(payload, &raw); err != nil {
		return Claims{}, fmt.Errorf("%w: claims: %w", ErrMalformedToken, err)
	}
	if raw.Exp == nil {
		return Claims{}, fmt.Errorf("%w: no exp", ErrMalformedToken)
	}
	c := Claims{Issuer: raw.Iss, Audiences: raw.Aud}
	var err error
	if c.Expiry, err = raw.Exp.time(); err != nil {
		return Claims{}, fmt.Errorf("%w: exp: %w", ErrMalformedToken, err)
	}
	if raw.Nbf != nil {
		if c.NotBefore, err = raw.Nbf.time(); err != nil {
			return Claims{}, fmt.Errorf("%w: nbf: %w", ErrMalformedToken, err)
		}
	}
	if k := raw.Kube; k != nil {
		c.Namespace = k.Namespace
		if k.ServiceAccount != nil {
			c.ServiceAccount = k.ServiceAccount.Name
		}
		if k.Pod != nil {
			c.Pod, c.PodUID = k.Pod.Name, k.Pod.UID
		}
	}
	return c, nil
}

func (t jsonTime) time() (time.Time, error) {
	if t < 0 || t > maxJWTTime {
		return time.Time{}, fmt.Errorf("%v out of range", float64(t))
	}
	return time.Unix(int64(t), 0), nil
}

// decodePart decodes one base64url JSON part into v.
func decodePart(part string, v any) error {
	b, err := base64.RawURLEncoding.DecodeString(part)
	if err != nil {
		return err
	}
	d := json.NewDecoder(bytes.NewReader(b))
	if err := d.Decode(v); err != nil {
		return err
	}
	if d.More() {
		return errors.New("trailing data")
	}
	return nil
}

// Check says whether the claims could pass a review at now for issuer
// (unchecked when empty) and audience.
func (c Claims) Check(now time.Time, issuer, audience string) error {
	switch {
	case !now.Before(c.Expiry.Add(clockSkew)):
		return fmt.Errorf("%w: expired at %s", ErrMalformedToken, c.Expiry.UTC().Format(time.RFC3339))
	case !c.NotBefore.IsZero() && now.Add(clockSkew).Before(c.NotBefore):
		return fmt.Errorf("%w: not valid before %s", ErrMalformedToken, c.NotBefore.UTC().Format(time.RFC3339))
	case issuer != "" && c.Issuer != issuer:
		return fmt.Errorf("%w: issuer %q, want %q", ErrMalformedToken, truncate(c.Issuer), issuer)
	}
	for _, a := range c.Audiences {
		if a == audience {
			return nil
		}
	}
	return fmt.Errorf("%w: not issued for audience %q", ErrMalformedToken, audience)
}
