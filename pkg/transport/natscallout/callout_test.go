package natscallout_test

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"

	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/testkit"
	"github.com/kvroute/kvroute/pkg/testkit/apiserver"
	"github.com/kvroute/kvroute/pkg/transport/natscallout"
)

var apiServer apiserver.Server

func TestMain(m *testing.M) { os.Exit(apiServer.Main(m)) }

const (
	testNS, testPool = "llm", "pool"
	relaySA, eppSA   = "kv-relay", "kv-epp"
)

// cluster is a namespace of envtest's API server with the relays' and the
// EPP's ServiceAccounts, and pods that run under them.
type cluster struct {
	cs *kubernetes.Clientset
	ns string
}

var namespaces atomic.Int32

func newCluster(t *testing.T) *cluster {
	t.Helper()
	cfg := apiServer.Require(t)
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{cs: cs, ns: fmt.Sprintf("%s-%d", testNS, namespaces.Add(1))}
	ctx := context.Background()
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: c.ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, sa := range []string{relaySA, eppSA, "someone-else"} {
		if _, err := cs.CoreV1().ServiceAccounts(c.ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// poolLabels are what the pool's selector picks in these tests.
var poolLabels = map[string]string{"app": "vllm", "kvroute.io/pool": testPool}

// pod is a pod of the pool running under sa.
func (c *cluster) pod(t *testing.T, name, sa string) *corev1.Pod {
	t.Helper()
	return c.podWith(t, name, sa, poolLabels)
}

// podWith is a pod with labels running under sa.
func (c *cluster) podWith(t *testing.T, name, sa string, labels map[string]string) *corev1.Pod {
	t.Helper()
	p := apiserver.PodUnder(t, c.cs, c.ns, name, sa)
	p.Labels = labels
	p, err := c.cs.CoreV1().Pods(c.ns).Update(context.Background(), p, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func (c *cluster) token(t *testing.T, sa, audience string, pod *corev1.Pod) string {
	t.Helper()
	return apiserver.Token(t, c.cs, c.ns, sa, audience, pod)
}

// rig is a NATS server whose every client is authorised by the callout,
// in the accounts the chart configures: AUTH for the callout alone, KV
// for everyone it admits.
type rig struct {
	nats     *testkit.NATS
	reg      *prometheus.Registry
	password string
}

func startRig(t *testing.T, c *cluster, o natscallout.Options) *rig {
	t.Helper()
	return startMember(t, c, o, nil)
}

// startMember is startRig with further server options (a cluster's).
func startMember(t *testing.T, c *cluster, o natscallout.Options, configure func(*server.Options)) *rig {
	t.Helper()
	dir := t.TempDir()
	if err := natscallout.GenerateKeys(dir); err != nil {
		t.Fatal(err)
	}
	issuer, password, err := natscallout.LoadKeys(dir)
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := issuer.PublicKey()
	n := testkit.StartNATS(t, testkit.NATSOptions{JetStream: o.JetStream, Configure: func(so *server.Options) {
		authAcc, kv := server.NewAccount("AUTH"), server.NewAccount(natscallout.DefaultAccount)
		so.Accounts = []*server.Account{authAcc, kv}
		so.Users = []*server.User{{Username: natscallout.AuthUser, Password: password, Account: authAcc}}
		so.AuthCallout = &server.AuthCallout{Issuer: pub, Account: "AUTH", AuthUsers: []string{natscallout.AuthUser}}
		if configure != nil {
			configure(so)
		}
	}})
	if o.JetStream {
		kv, err := n.Server.LookupAccount(natscallout.DefaultAccount)
		if err != nil {
			t.Fatal(err)
		}
		if err := kv.EnableJetStream(map[string]server.JetStreamAccountLimits{"": {MaxMemory: -1, MaxStore: -1, MaxStreams: -1, MaxConsumers: -1}}, nil); err != nil {
			t.Fatal(err)
		}
	}
	r := &rig{nats: n, reg: prometheus.NewRegistry(), password: password}
	nc := n.Connect(t, "callout", nats.UserInfo(natscallout.AuthUser, password))
	o.Namespace, o.Pool, o.Issuer, o.Registerer = c.ns, testPool, issuer, r.reg
	o.Logger = slog.New(slog.DiscardHandler)
	if o.RelayServiceAccount == "" {
		o.RelayServiceAccount = relaySA
	}
	if o.EPPServiceAccount == "" {
		o.EPPServiceAccount = eppSA
	}
	if o.Reviewer == nil {
		o.Reviewer = &natscallout.TokenReviewer{Client: c.cs.AuthenticationV1(), Audience: natscallout.DefaultAudience}
	}
	if o.TokenIssuer == "" {
		o.TokenIssuer = c.issuer(t)
	}
	if o.Signatures == nil {
		o.Signatures = c.keys(t)
	}
	if o.Pods == nil {
		pods := natscallout.NewPodLister(c.cs, c.ns, labels.SelectorFromSet(poolLabels))
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(func() { cancel(); pods.Shutdown() })
		if err := pods.Start(ctx); err != nil {
			t.Fatal(err)
		}
		o.Pods = pods
	}
	svc, err := natscallout.New(nc, o)
	if err != nil {
		t.Fatal(err)
	}
	testkit.Go(t, "the auth callout", svc.Run)
	// Run has subscribed once a client is answered: wait for a refusal.
	testkit.WaitFor(t, "the callout to answer", func() error {
		nc, err := nats.Connect(n.URL(), nats.Token("warm-up"), nats.Timeout(time.Second))
		if err == nil {
			nc.Close()
			t.Fatal("a made-up token was admitted")
		}
		if seen := testkit.Value(t, r.reg, "kvroute_natsauth_denied_total", "reason", "malformed_token"); seen < 1 {
			return fmt.Errorf("testkit.Value(t, r.reg, \"kvroute_natsauth_denied_total\", \"reason\", \"unauthenticated\") is %v, want >= %v", seen, 1)
		}
		return nil
	})
	return r
}

// issuer is the API server's service-account issuer, as its tokens name it.
func (c *cluster) issuer(t *testing.T) string {
	t.Helper()
	claims, err := natscallout.ParseToken(c.token(t, eppSA, natscallout.DefaultAudience, nil))
	if err != nil || claims.Issuer == "" {
		t.Fatalf("the API server's tokens: %+v, %v", claims, err)
	}
	return claims.Issuer
}

// keys is the API server's service-account key set, read as the callout
// reads it.
func (c *cluster) keys(t *testing.T) *natscallout.KeySet {
	t.Helper()
	ks := natscallout.NewKeySet(c.cs.Discovery().RESTClient(), natscallout.KeySetOptions{})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := ks.Start(ctx); err != nil {
		t.Fatal(err)
	}
	return ks
}

// connect connects with token, reporting permission errors on errs.
func (r *rig) connect(token string, errs chan<- error, extra ...nats.Option) (*nats.Conn, error) {
	opts := append([]nats.Option{nats.Timeout(5 * time.Second), nats.MaxReconnects(0)}, extra...)
	if token != "" {
		opts = append(opts, nats.Token(token))
	}
	if errs != nil {
		opts = append(opts, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			select {
			case errs <- err:
			default:
			}
		}))
	}
	return nats.Connect(r.nats.URL(), opts...)
}

func violation(t *testing.T, errs <-chan error, what string) {
	t.Helper()
	select {
	case err := <-errs:
		if !strings.Contains(strings.ToLower(err.Error()), "permissions violation") {
			t.Fatalf("%s: %v, want a permissions violation", what, err)
		}
	case <-time.After(testkit.WaitLimit):
		t.Fatalf("%s: the server allowed it", what)
	}
}

func TestTheCalloutGivesEachPodItsOwnSubjectsOnly(t *testing.T) {
	c := newCluster(t)
	r := startRig(t, c, natscallout.Options{})
	relay0, relay1 := c.pod(t, "vllm-0", relaySA), c.pod(t, "vllm-1", relaySA)
	eppPod := c.pod(t, "epp-0", eppSA)

	eppErrs := make(chan error, 8)
	epp, err := r.connect(c.token(t, eppSA, natscallout.DefaultAudience, eppPod), eppErrs, nats.CustomInboxPrefix(events.EPPInboxPrefix))
	if err != nil {
		t.Fatalf("the EPP's token: %v", err)
	}
	defer epp.Close()
	got := make(chan *nats.Msg, 8)
	if _, err := epp.ChanSubscribe(events.PoolSubject(c.ns, testPool), got); err != nil {
		t.Fatal(err)
	}
	if err := epp.Flush(); err != nil {
		t.Fatal(err)
	}

	relayErrs := make(chan error, 8)
	relay, err := r.connect(c.token(t, relaySA, natscallout.DefaultAudience, relay0), relayErrs)
	if err != nil {
		t.Fatalf("vllm-0's relay token: %v", err)
	}
	defer relay.Close()
	// Its own subject: delivered.
	if err := relay.Publish(events.Subject(c.ns, testPool, relay0.Name), []byte("own")); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-got:
		if m.Subject != events.Subject(c.ns, testPool, relay0.Name) {
			t.Fatalf("the EPP got %s", m.Subject)
		}
	case <-time.After(testkit.WaitLimit):
		t.Fatal("the relay's own event never arrived")
	}
	// Another pod's subject: refused by the server.
	if err := relay.Publish(events.Subject(c.ns, testPool, relay1.Name), []byte("forged")); err != nil {
		t.Fatal(err)
	}
	violation(t, relayErrs, "vllm-0's relay publishing vllm-1's events")
	// Another pod's snapshot requests: refused too.
	if _, err := relay.Subscribe(events.SnapshotSubject(c.ns, testPool, relay1.Name), func(*nats.Msg) {}); err != nil {
		t.Fatal(err)
	}
	violation(t, relayErrs, "vllm-0's relay answering vllm-1's snapshot requests")

	// Its own snapshot requests: it answers them, many replies to one.
	if _, err := relay.Subscribe(events.SnapshotSubject(c.ns, testPool, relay0.Name), func(m *nats.Msg) {
		for i := range 3 {
			_ = relay.Publish(m.Reply, []byte{byte(i)})
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := relay.Flush(); err != nil {
		t.Fatal(err)
	}
	inbox := epp.NewRespInbox()
	replies, err := epp.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	if err := epp.PublishRequest(events.SnapshotSubject(c.ns, testPool, relay0.Name), inbox, nil); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, err := replies.NextMsg(testkit.WaitLimit); err != nil {
			t.Fatalf("snapshot reply %d: %v", i, err)
		}
	}
	// The EPP publishes no events.
	if err := epp.Publish(events.Subject(c.ns, testPool, relay0.Name), []byte("forged")); err != nil {
		t.Fatal(err)
	}
	violation(t, eppErrs, "the EPP publishing events")
	if got := testkit.Value(t, r.reg, "kvroute_natsauth_allowed_total", "role", "relay"); got != 1 {
		t.Errorf("allowed relays = %v", got)
	}
}

func TestTheCalloutRefusesEveryOtherClient(t *testing.T) {
	c := newCluster(t)
	r := startRig(t, c, natscallout.Options{})
	pod := c.pod(t, "vllm-0", relaySA)
	gone := c.pod(t, "vllm-gone", relaySA)
	goneToken := c.token(t, relaySA, natscallout.DefaultAudience, gone)
	if err := c.cs.CoreV1().Pods(c.ns).Delete(context.Background(), gone.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64(0))}); err != nil {
		t.Fatal(err)
	}
	other := newCluster(t)
	otherPod := other.pod(t, "vllm-0", relaySA)
	outside := c.podWith(t, "not-a-model-server", relaySA, map[string]string{"app": "batch-job"})
	// A pod made again under a deleted one's name has another UID.
	again := c.pod(t, gone.Name, relaySA)
	if again.UID == gone.UID {
		t.Fatal("the same UID twice")
	}
	valid := c.token(t, relaySA, natscallout.DefaultAudience, pod)
	claims, err := natscallout.ParseToken(valid)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, token, reason string
	}{
		{"no credentials at all", "", "no_token"},
		{"a token someone made up", "eyJhbGciOiJSUzI1NiJ9.e30.c2ln", "malformed_token"},
		{"a token for the API server, not for NATS", c.token(t, relaySA, "https://kubernetes.default.svc", pod), "invalid_claims"},
		{"a relay token bound to no pod", c.token(t, relaySA, natscallout.DefaultAudience, nil), "not_pod_bound"},
		{"a token of a pod that was deleted", goneToken, "pod_gone"},
		{"a token of a ServiceAccount without NATS rights", c.token(t, "someone-else", natscallout.DefaultAudience, nil), "unknown_service_account"},
		{"a relay token of another namespace", other.token(t, relaySA, natscallout.DefaultAudience, otherPod), "wrong_namespace"},
		{"a relay token of a pod the pool's selector does not pick", c.token(t, relaySA, natscallout.DefaultAudience, outside), "pod_not_in_pool"},
		{"a valid token's claims with a forged signature", forge(t, valid, nil), "bad_signature"},
		{"a valid token's claims made to name another pod of the pool", forge(t, valid, map[string]any{"pod": map[string]any{"name": again.Name, "uid": string(again.UID)}}), "bad_signature"},
		{"a valid token's claims with the expiry pushed back", forge(t, valid, map[string]any{"exp": claims.Expiry.Add(24 * time.Hour).Unix()}), "bad_signature"},
		{"a valid token's claims signed by another key under the API server's kid", resign(t, valid, otherKey, ""), "bad_signature"},
		{"a valid token's claims signed by another key under a kid of its own", resign(t, valid, otherKey, "made-up"), "bad_signature"},
		{"a valid token with its signature cut off", valid[:strings.LastIndexByte(valid, '.')+1] + "c2ln", "bad_signature"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := testkit.Value(t, r.reg, "kvroute_natsauth_denied_total", "reason", tt.reason)
			nc, err := r.connect(tt.token, nil)
			if err == nil {
				nc.Close()
				t.Fatal("connected")
			}
			if !errors.Is(err, nats.ErrAuthorization) && !strings.Contains(strings.ToLower(err.Error()), "authorization") {
				t.Errorf("error %v, want an authorization violation", err)
			}
			if got := testkit.Value(t, r.reg, "kvroute_natsauth_denied_total", "reason", tt.reason) - before; got != 1 {
				t.Errorf("denied_total{reason=%q} rose by %v, want 1", tt.reason, got)
			}
		})
	}
}

// forge is token with its claims changed (kubernetes.io's pod, or a
// top-level claim) and its signature broken: what a client that saw a
// valid token could make of it.
func forge(t *testing.T, token string, set map[string]any) string {
	t.Helper()
	parts := strings.Split(token, ".")
	raw, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	var claims map[string]any
	if err := json.Unmarshal(raw, &claims); err != nil {
		t.Fatal(err)
	}
	for k, v := range set {
		if k == "pod" {
			claims["kubernetes.io"].(map[string]any)["pod"] = v
		} else {
			claims[k] = v
		}
	}
	if raw, err = json.Marshal(claims); err != nil {
		t.Fatal(err)
	}
	sig := []byte(parts[2])
	if i := len(sig) / 2; sig[i] == 'A' {
		sig[i] = 'B'
	} else {
		sig[i] = 'A'
	}
	return parts[0] + "." + base64.RawURLEncoding.EncodeToString(raw) + "." + string(sig)
}

// otherKey signs forgeries: a key of the right kind that is not the API
// server's.
var otherKey = func() crypto.Signer {
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		panic(err)
	}
	return k
}()

// resign is token's header and claims signed with key (RS256, or ES256
// for an ECDSA key), under kid when it is not empty: a forgery that
// copies every claim of a real token and differs only in its signature.
func resign(t *testing.T, token string, key crypto.Signer, kid string) string {
	t.Helper()
	parts := strings.Split(token, ".")
	raw, err := base64.RawURLEncoding.DecodeString(parts[0])
	if err != nil {
		t.Fatal(err)
	}
	var hdr map[string]any
	if err := json.Unmarshal(raw, &hdr); err != nil {
		t.Fatal(err)
	}
	if kid != "" {
		hdr["kid"] = kid
	}
	hdr["alg"] = "RS256"
	if _, ok := key.(*ecdsa.PrivateKey); ok {
		hdr["alg"] = "ES256"
	}
	if raw, err = json.Marshal(hdr); err != nil {
		t.Fatal(err)
	}
	signed := base64.RawURLEncoding.EncodeToString(raw) + "." + parts[1]
	h := sha256.Sum256([]byte(signed))
	var sig []byte
	switch k := key.(type) {
	case *rsa.PrivateKey:
		sig, err = rsa.SignPKCS1v15(rand.Reader, k, crypto.SHA256, h[:])
	case *ecdsa.PrivateKey:
		var r, s *big.Int
		if r, s, err = ecdsa.Sign(rand.Reader, k, h[:]); err == nil {
			sig = append(r.FillBytes(make([]byte, 32)), s.FillBytes(make([]byte, 32))...)
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	return signed + "." + base64.RawURLEncoding.EncodeToString(sig)
}

// A storm of forged tokens, each of which copies a valid relay token's
// claims and passes every local check but the signature, while the valid
// relay reconnects again and again and new relays connect for the first
// time: none of the forgeries spends the review budget, so every relay
// is admitted every time, and the API server reviews only the relays.
func TestAValidRelayIsAdmittedThroughAStormOfForgedTokens(t *testing.T) {
	c := newCluster(t)
	reviews := &countingReviewer{next: &natscallout.TokenReviewer{Client: c.cs.AuthenticationV1(), Audience: natscallout.DefaultAudience}}
	// A budget of three reviews for the whole test, never replenished:
	// the relay's first connect and the two new relays' need them all.
	const burst = 3
	r := startRig(t, c, natscallout.Options{Reviewer: reviews, ReviewsPerSecond: 1e-6, ReviewBurst: burst, Workers: 4})
	pod := c.pod(t, "vllm-0", relaySA)
	token := c.token(t, relaySA, natscallout.DefaultAudience, pod)
	nc, err := r.connect(token, nil)
	if err != nil {
		t.Fatalf("the relay, before the storm: %v", err)
	}
	nc.Close()
	newcomers := []string{
		c.token(t, relaySA, natscallout.DefaultAudience, c.pod(t, "vllm-1", relaySA)),
		c.token(t, relaySA, natscallout.DefaultAudience, c.pod(t, "vllm-2", relaySA)),
	}
	ecKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	// Each one well-formed, unexpired, of the right issuer, audience,
	// namespace, ServiceAccount and live pod of the pool: before the
	// signature was checked locally, each one spent a review.
	forged := []string{
		forge(t, token, nil),
		forge(t, token, map[string]any{"jti": "x"}),
		resign(t, token, otherKey, ""),
		resign(t, token, ecKey, ""),
		resign(t, newcomers[0], otherKey, ""),
		resign(t, token, otherKey, "made-up"),
	}
	for _, f := range forged {
		if _, err := natscallout.ParseToken(f); err != nil {
			t.Fatalf("a forgery the local claims checks refuse: %v", err)
		}
	}
	ctx, stop := context.WithCancel(context.Background())
	var storm sync.WaitGroup
	var attempts atomic.Int64
	for i := range 8 {
		storm.Go(func() {
			for j := i; ctx.Err() == nil; j++ {
				attempts.Add(1)
				if nc, err := r.connect(forged[j%len(forged)], nil); err == nil {
					nc.Close()
					t.Error("a forged token was admitted")
					return
				}
			}
		})
	}
	const stormSize = 200
	testkit.WaitFor(t, "the storm to be under way", func() error {
		if n := testkit.Value(t, r.reg, "kvroute_natsauth_denied_total", "reason", "bad_signature"); n < stormSize {
			return fmt.Errorf("%v forgeries refused for their signature, want %d", n, stormSize)
		}
		return nil
	})
	const reconnects = 25
	admitted := 0
	for i := range reconnects {
		nc, err := r.connect(token, nil)
		if err != nil {
			t.Errorf("reconnect %d during the storm: %v", i, err)
			continue
		}
		admitted++
		nc.Close()
	}
	for i, tok := range newcomers {
		nc, err := r.connect(tok, nil)
		if err != nil {
			t.Errorf("new relay %d during the storm: %v", i, err)
			continue
		}
		nc.Close()
	}
	stop()
	storm.Wait()
	if admitted != reconnects {
		t.Errorf("the relay was admitted %d times in %d", admitted, reconnects)
	}
	if got := reviews.n.Load(); got != 1+int64(len(newcomers)) {
		t.Errorf("%d reviews during %d forged attempts, want %d: one for each relay", got, attempts.Load(), 1+len(newcomers))
	}
	if got := testkit.Value(t, r.reg, "kvroute_natsauth_denied_total", "reason", "rate_limited"); got != 0 {
		t.Errorf("%v connections refused for the review budget, want none", got)
	}
	if got := testkit.Value(t, r.reg, "kvroute_natsauth_review_cache_hits_total"); got < reconnects {
		t.Errorf("%v connections admitted from remembered reviews, want at least %d", got, reconnects)
	}
	if got := testkit.Value(t, r.reg, "kvroute_natsauth_allowed_total", "role", "relay"); got != 1+reconnects+float64(len(newcomers)) {
		t.Errorf("%v relays admitted, want %d", got, 1+reconnects+len(newcomers))
	}
}

// A storm of garbage (made up, for another audience, of another
// ServiceAccount) is refused by the local checks before the signature's
// and the review's; a valid relay reconnects through it.
func TestAValidRelayIsAdmittedThroughAStormOfGarbage(t *testing.T) {
	c := newCluster(t)
	reviews := &countingReviewer{next: &natscallout.TokenReviewer{Client: c.cs.AuthenticationV1(), Audience: natscallout.DefaultAudience}}
	r := startRig(t, c, natscallout.Options{Reviewer: reviews, ReviewsPerSecond: 1e-6, ReviewBurst: 1, Workers: 4})
	pod := c.pod(t, "vllm-0", relaySA)
	token := c.token(t, relaySA, natscallout.DefaultAudience, pod)
	garbage := []string{
		"warm-up",
		"eyJhbGciOiJSUzI1NiJ9.e30.c2ln",
		c.token(t, relaySA, "https://kubernetes.default.svc", pod),
		c.token(t, "someone-else", natscallout.DefaultAudience, nil),
	}
	ctx, stop := context.WithCancel(context.Background())
	var storm sync.WaitGroup
	for i := range 8 {
		storm.Go(func() {
			for j := i; ctx.Err() == nil; j++ {
				if nc, err := r.connect(garbage[j%len(garbage)], nil); err == nil {
					nc.Close()
					t.Error("a bad token was admitted")
					return
				}
			}
		})
	}
	testkit.WaitFor(t, "the storm to reach every local check", func() error {
		for _, reason := range []string{"malformed_token", "invalid_claims", "unknown_service_account"} {
			if n := testkit.Value(t, r.reg, "kvroute_natsauth_denied_total", "reason", reason); n < 10 {
				return fmt.Errorf("%v %s denials", n, reason)
			}
		}
		return nil
	})
	const reconnects = 10
	for i := range reconnects {
		nc, err := r.connect(token, nil)
		if err != nil {
			t.Errorf("connect %d during the storm: %v", i, err)
			continue
		}
		nc.Close()
	}
	stop()
	storm.Wait()
	if got := reviews.n.Load(); got != 1 {
		t.Errorf("%d reviews, want the relay's one", got)
	}
	for _, reason := range []string{"bad_signature", "rate_limited"} {
		if got := testkit.Value(t, r.reg, "kvroute_natsauth_denied_total", "reason", reason); got != 0 {
			t.Errorf("%v %s denials: garbage got past the claims checks", got, reason)
		}
	}
}

// The API server stays the authority on revocation: a token rightly
// signed, of a pod deleted since, is refused by the review when the
// callout's own view of the pods has not caught up yet.
func TestARightlySignedTokenOfADeletedPodIsRefusedByTheReview(t *testing.T) {
	c := newCluster(t)
	r := startRig(t, c, natscallout.Options{Pods: laggingPods{}})
	pod := c.pod(t, "vllm-0", relaySA)
	token := c.token(t, relaySA, natscallout.DefaultAudience, pod)
	if err := c.cs.CoreV1().Pods(c.ns).Delete(context.Background(), pod.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64(0))}); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "the pod to be gone", func() error {
		_, err := c.cs.CoreV1().Pods(c.ns).Get(context.Background(), pod.Name, metav1.GetOptions{})
		if err == nil {
			return errors.New("the pod is still there")
		}
		return nil
	})
	nc, err := r.connect(token, nil)
	if err == nil {
		nc.Close()
		t.Fatal("a deleted pod's token was admitted")
	}
	if got := testkit.Value(t, r.reg, "kvroute_natsauth_denied_total", "reason", "unauthenticated"); got != 1 {
		t.Errorf("%v refusals by the review, want 1", got)
	}
	if got := testkit.Value(t, r.reg, "kvroute_natsauth_denied_total", "reason", "bad_signature"); got != 0 {
		t.Errorf("%v refusals for the signature of a token the API server signed", got)
	}
}

// laggingPods is a view of the pods that has not seen any deletion yet:
// an informer behind the API server.
type laggingPods struct{}

func (laggingPods) Check(context.Context, string, string, string, bool) error { return nil }

// A user expires with its token, or sooner with UserTTL: the server then
// closes the connection, and the token of a pod deleted meanwhile does
// not get it back, though its review is remembered.
func TestAConnectionEndsWhenItsUserExpiresAndARevokedTokenIsNotReadmitted(t *testing.T) {
	c := newCluster(t)
	r := startRig(t, c, natscallout.Options{UserTTL: 2 * time.Second})
	// The issued users, as the callout answers the server.
	users := make(chan *jwt.UserClaims, 16)
	watch := r.nats.Connect(t, "watch", nats.UserInfo(natscallout.AuthUser, r.password))
	if _, err := watch.Subscribe(">", func(m *nats.Msg) {
		rc, err := jwt.DecodeAuthorizationResponseClaims(string(m.Data))
		if err != nil || rc.Jwt == "" {
			return
		}
		if uc, err := jwt.DecodeUserClaims(rc.Jwt); err == nil {
			users <- uc
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := watch.Flush(); err != nil {
		t.Fatal(err)
	}
	pod := c.pod(t, "vllm-0", relaySA)
	token := c.token(t, relaySA, natscallout.DefaultAudience, pod)
	claims, err := natscallout.ParseToken(token)
	if err != nil {
		t.Fatal(err)
	}
	closed := make(chan error, 1)
	opts := []nats.Option{nats.Token(token), nats.MaxReconnects(0), nats.Timeout(5 * time.Second),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			select {
			case closed <- err:
			default:
			}
		})}
	connectedAt := time.Now()
	nc, err := nats.Connect(r.nats.URL(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	select {
	case uc := <-users:
		if uc.Expires == 0 || uc.Expires > connectedAt.Add(2*time.Second).Unix()+1 || uc.Expires >= claims.Expiry.Unix() {
			t.Errorf("the user expires at %d; want within UserTTL of %d, before the token's %d", uc.Expires, connectedAt.Unix(), claims.Expiry.Unix())
		}
	case <-time.After(testkit.WaitLimit):
		t.Fatal("no user issued")
	}
	select {
	case err := <-closed:
		if !strings.Contains(strings.ToLower(err.Error()), "expired") {
			t.Errorf("closed with %v, want an expired user", err)
		}
	case <-time.After(testkit.WaitLimit):
		t.Fatal("the connection outlived its user")
	}
	testkit.WaitFor(t, "the server to close the connection", func() error {
		if !nc.IsClosed() {
			return fmt.Errorf("connection %v", nc.Status())
		}
		return nil
	})

	// The pod is deleted: its token's review is remembered, yet it is
	// refused.
	if err := c.cs.CoreV1().Pods(c.ns).Delete(context.Background(), pod.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64(0))}); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "the deleted pod's token to be refused", func() error {
		nc, err := r.connect(token, nil)
		if err == nil {
			nc.Close()
			return errors.New("the deleted pod's token was admitted")
		}
		if n := testkit.Value(t, r.reg, "kvroute_natsauth_denied_total", "reason", "pod_gone"); n < 1 {
			return fmt.Errorf("refused (%v), but %v refusals for a pod gone", err, n)
		}
		return nil
	})

	// Without UserTTL, a user expires exactly when its token does.
	r2 := startRig(t, c, natscallout.Options{})
	p2 := c.pod(t, "vllm-1", relaySA)
	tok2 := c.token(t, relaySA, natscallout.DefaultAudience, p2)
	cl2, _ := natscallout.ParseToken(tok2)
	watch2 := r2.nats.Connect(t, "watch", nats.UserInfo(natscallout.AuthUser, r2.password))
	users2 := make(chan *jwt.UserClaims, 4)
	if _, err := watch2.Subscribe(">", func(m *nats.Msg) {
		if rc, err := jwt.DecodeAuthorizationResponseClaims(string(m.Data)); err == nil && rc.Jwt != "" {
			if uc, err := jwt.DecodeUserClaims(rc.Jwt); err == nil {
				users2 <- uc
			}
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := watch2.Flush(); err != nil {
		t.Fatal(err)
	}
	nc2, err := r2.connect(tok2, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer nc2.Close()
	select {
	case uc := <-users2:
		if uc.Expires != cl2.Expiry.Unix() {
			t.Errorf("the user expires at %d, its token at %d", uc.Expires, cl2.Expiry.Unix())
		}
	case <-time.After(testkit.WaitLimit):
		t.Fatal("no user issued")
	}
}

// countingReviewer counts the reviews it passes on to the API server.
type countingReviewer struct {
	next natscallout.Reviewer
	n    atomic.Int64
}

func (r *countingReviewer) Review(ctx context.Context, token string) (natscallout.Identity, error) {
	r.n.Add(1)
	return r.next.Review(ctx, token)
}

// In a NATS cluster each member has its own callout with keys of its own:
// every client is admitted by its own member's callout, whichever member
// it connects to, and the requests the other callouts hear are left to it.
func TestEveryMemberOfAClusterAdmitsThroughItsOwnCallout(t *testing.T) {
	c := newCluster(t)
	token := c.token(t, eppSA, natscallout.DefaultAudience, nil)
	var routes []*url.URL
	var members []*rig
	for i := range 3 {
		members = append(members, startMember(t, c, natscallout.Options{LocalServer: true}, func(so *server.Options) {
			so.ServerName = fmt.Sprintf("nats-%d", i)
			so.Cluster = server.ClusterOpts{Name: "kv", Host: "127.0.0.1", Port: server.RANDOM_PORT}
			so.Routes = routes
		}))
		u, err := url.Parse("nats-route://" + members[i].nats.Server.ClusterAddr().String())
		if err != nil {
			t.Fatal(err)
		}
		routes = append(routes, u)
	}
	for _, m := range members {
		testkit.WaitFor(t, "the cluster to form", func() error {
			if seen := m.nats.Server.NumRemotes(); seen != 2 {
				return fmt.Errorf("m.nats.Server.NumRemotes() is %v, want %v", seen, 2)
			}
			return nil
		})
	}
	foreign := func() (n float64) {
		for _, m := range members {
			n += testkit.Value(t, m.reg, "kvroute_natsauth_foreign_requests_total")
		}
		return n
	}
	before := foreign()
	for i, m := range members {
		for range 6 {
			nc, err := m.connect(token, nil)
			if err != nil {
				t.Fatalf("the EPP's token refused by member %d: %v", i, err)
			}
			nc.Close()
		}
		if got := testkit.Value(t, m.reg, "kvroute_natsauth_allowed_total", "role", "epp"); got != 6 {
			t.Errorf("member %d's callout admitted %v, want its own 6", i, got)
		}
	}
	if foreign() == before {
		t.Error("no callout heard another member's request: the members are not one cluster")
	}
}

// With JetStream, the stream bounds each pod's subject by itself: one
// relay flooding its own subject discards its own oldest batches, and
// every other pod's are still there. The EPP's credential creates the
// stream and reads it, but cannot update, purge or delete it, nor read
// any inbox but its own.
func TestOneRelaysFloodLeavesEveryOtherPodsHistoryAndTheEPPCannotRewriteIt(t *testing.T) {
	c := newCluster(t)
	r := startRig(t, c, natscallout.Options{JetStream: true})
	eppPod := c.podWith(t, "epp-0", eppSA, map[string]string{"app": "epp"})
	eppErrs := make(chan error, 64)
	epp, err := r.connect(c.token(t, eppSA, natscallout.DefaultAudience, eppPod), eppErrs, nats.CustomInboxPrefix(events.EPPInboxPrefix))
	if err != nil {
		t.Fatalf("the EPP: %v", err)
	}
	defer epp.Close()
	js, err := jetstream.New(epp)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), testkit.WaitLimit)
	defer cancel()
	const perPod, quiet, flood, size = 50, 20, 2000, 1 << 10
	// Room for four pods' share: less than the flood alone.
	stream, err := events.EnsureStream(ctx, js, events.StreamConfig{Namespace: c.ns, Pool: testPool, MaxMsgsPerPod: perPod,
		MaxBytes: 4 * perPod * (size + 256), Storage: jetstream.MemoryStorage})
	if err != nil {
		t.Fatalf("the EPP creating the stream: %v", err)
	}
	relays := map[string]*nats.Conn{}
	for _, name := range []string{"vllm-0", "vllm-1", "vllm-2"} {
		nc, err := r.connect(c.token(t, relaySA, natscallout.DefaultAudience, c.pod(t, name, relaySA)), nil)
		if err != nil {
			t.Fatalf("%s's relay: %v", name, err)
		}
		defer nc.Close()
		relays[name] = nc
	}
	payload := make([]byte, size)
	publish := func(pod string, n int) {
		for i := range n {
			payload[0] = byte(i)
			if err := relays[pod].Publish(events.Subject(c.ns, testPool, pod), payload); err != nil {
				t.Fatal(err)
			}
		}
		if err := relays[pod].Flush(); err != nil {
			t.Fatal(err)
		}
	}
	publish("vllm-1", quiet)
	publish("vllm-2", quiet)
	publish("vllm-0", flood)
	perSubject := func() map[string]uint64 {
		info, err := stream.Info(ctx, jetstream.WithSubjectFilter(events.PoolSubject(c.ns, testPool)))
		if err != nil {
			t.Fatal(err)
		}
		if info.State.LastSeq < 2*quiet+flood {
			return nil
		}
		return info.State.Subjects
	}
	want := map[string]uint64{
		events.Subject(c.ns, testPool, "vllm-0"): perPod,
		events.Subject(c.ns, testPool, "vllm-1"): quiet,
		events.Subject(c.ns, testPool, "vllm-2"): quiet,
	}
	testkit.WaitFor(t, "the stream to hold every pod's share", func() error {
		if got := perSubject(); fmt.Sprint(got) != fmt.Sprint(want) {
			return fmt.Errorf("batches per subject %v, want %v", got, want)
		}
		return nil
	})
	// The EPP reads a quiet pod's whole history through its own inbox.
	cons, err := js.OrderedConsumer(ctx, stream.CachedInfo().Config.Name, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{events.Subject(c.ns, testPool, "vllm-1")}})
	if err != nil {
		t.Fatalf("the EPP's ordered consumer: %v", err)
	}
	batch, err := cons.Fetch(quiet, jetstream.FetchMaxWait(testkit.WaitLimit))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for range batch.Messages() {
		n++
	}
	if n != quiet {
		t.Fatalf("the EPP read %d of vllm-1's %d batches", n, quiet)
	}

	// Nothing the EPP may do changes the stream.
	short := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.Background(), 2*time.Second)
	}
	cfg := stream.CachedInfo().Config
	cfg.MaxMsgs = 1
	for what, attempt := range map[string]func(context.Context) error{
		"update the stream to one message": func(ctx context.Context) error { _, err := js.UpdateStream(ctx, cfg); return err },
		"purge the stream":                 func(ctx context.Context) error { return stream.Purge(ctx) },
		"delete the stream":                func(ctx context.Context) error { return js.DeleteStream(ctx, cfg.Name) },
		"delete a message":                 func(ctx context.Context) error { return stream.DeleteMsg(ctx, 1) },
	} {
		ctx, cancel := short()
		err := attempt(ctx)
		cancel()
		if err == nil {
			t.Errorf("the EPP could %s", what)
		}
	}
	if got := perSubject(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("after the EPP's attempts: %v, want %v", got, want)
	}
	// Every other client's replies go to _INBOX: the EPP may not read them.
	drain(eppErrs)
	if _, err := epp.SubscribeSync("_INBOX.>"); err != nil {
		t.Fatal(err)
	}
	violation(t, eppErrs, "the EPP reading every client's replies")
}

// drain empties errs of what earlier steps left there.
func drain(errs <-chan error) {
	for {
		select {
		case <-errs:
		default:
			return
		}
	}
}
