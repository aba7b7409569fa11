package natscallout_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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

func (c *cluster) pod(t *testing.T, name, sa string) *corev1.Pod {
	t.Helper()
	return apiserver.PodUnder(t, c.cs, c.ns, name, sa)
}

func (c *cluster) token(t *testing.T, sa, audience string, pod *corev1.Pod) string {
	t.Helper()
	return apiserver.Token(t, c.cs, c.ns, sa, audience, pod)
}

// rig is a NATS server whose every client is authorised by the callout,
// in the accounts the chart configures: AUTH for the callout alone, KV
// for everyone it admits.
type rig struct {
	nats *testkit.NATS
	reg  *prometheus.Registry
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
	n := testkit.StartNATS(t, testkit.NATSOptions{Configure: func(so *server.Options) {
		authAcc, kv := server.NewAccount("AUTH"), server.NewAccount(natscallout.DefaultAccount)
		so.Accounts = []*server.Account{authAcc, kv}
		so.Users = []*server.User{{Username: natscallout.AuthUser, Password: password, Account: authAcc}}
		so.AuthCallout = &server.AuthCallout{Issuer: pub, Account: "AUTH", AuthUsers: []string{natscallout.AuthUser}}
		if configure != nil {
			configure(so)
		}
	}})
	r := &rig{nats: n, reg: prometheus.NewRegistry()}
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
		if seen := testkit.Value(t, r.reg, "kvroute_natsauth_denied_total", "reason", "unauthenticated"); seen < 1 {
			return fmt.Errorf("testkit.Value(t, r.reg, \"kvroute_natsauth_denied_total\", \"reason\", \"unauthenticated\") is %v, want >= %v", seen, 1)
		}
		return nil
	})
	return r
}

// connect connects with token, reporting permission errors on errs.
func (r *rig) connect(token string, errs chan<- error) (*nats.Conn, error) {
	opts := []nats.Option{nats.Timeout(5 * time.Second), nats.MaxReconnects(0)}
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
	epp, err := r.connect(c.token(t, eppSA, natscallout.DefaultAudience, eppPod), eppErrs)
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
	tests := []struct {
		name, token, reason string
	}{
		{"no credentials at all", "", "no_token"},
		{"a token someone made up", "eyJhbGciOiJSUzI1NiJ9.e30.c2ln", "unauthenticated"},
		{"a token for the API server, not for NATS", c.token(t, relaySA, "https://kubernetes.default.svc", pod), "unauthenticated"},
		{"a relay token bound to no pod", c.token(t, relaySA, natscallout.DefaultAudience, nil), "not_pod_bound"},
		{"a token of a pod that was deleted", goneToken, "unauthenticated"},
		{"a token of a ServiceAccount without NATS rights", c.token(t, "someone-else", natscallout.DefaultAudience, nil), "unknown_service_account"},
		{"a relay token of another namespace", other.token(t, relaySA, natscallout.DefaultAudience, otherPod), "wrong_namespace"},
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

// A flood of connection attempts is refused at the callout, not passed on
// to the API server.
func TestTheCalloutBoundsTheReviewsItAsksFor(t *testing.T) {
	c := newCluster(t)
	reviews := &countingReviewer{next: &natscallout.TokenReviewer{Client: c.cs.AuthenticationV1()}}
	r := startRig(t, c, natscallout.Options{Reviewer: reviews, ReviewsPerSecond: 0.001, ReviewBurst: 3})
	const attempts = 20
	for range attempts {
		if nc, err := r.connect("eyJhbGciOiJSUzI1NiJ9.e30.c2ln", nil); err == nil {
			nc.Close()
			t.Fatal("connected")
		}
	}
	if got := reviews.n.Load(); got > 3 {
		t.Errorf("%d reviews for %d attempts, want at most the burst of 3", got, attempts)
	}
	if got := testkit.Value(t, r.reg, "kvroute_natsauth_denied_total", "reason", "rate_limited"); got < attempts-3 {
		t.Errorf("rate_limited denials = %v, want at least %d", got, attempts-3)
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
