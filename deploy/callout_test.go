package deploy

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/epp"
	"github.com/kvroute/kvroute/pkg/epp/prefixquery"
	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/prepare/prefixmatch"
	"github.com/kvroute/kvroute/pkg/sim"
	"github.com/kvroute/kvroute/pkg/sim/blockpool"
	"github.com/kvroute/kvroute/pkg/testkit"
	"github.com/kvroute/kvroute/pkg/testkit/apiserver"
	"github.com/kvroute/kvroute/pkg/transport/natsauth"
	"github.com/kvroute/kvroute/pkg/transport/natscallout"
)

// container is the rendered workload's container called name.
func container(t *testing.T, obj *unstructured.Unstructured, name string) map[string]any {
	t.Helper()
	cs, _, _ := unstructured.NestedSlice(obj.Object, "spec", "template", "spec", "containers")
	for _, c := range cs {
		if m := c.(map[string]any); m["name"] == name {
			return m
		}
	}
	t.Fatalf("%s has no container %s", obj.GetName(), name)
	return nil
}

// containerArgs are the arguments the rendered workload gives container name.
func containerArgs(t *testing.T, obj *unstructured.Unstructured, name string) []string {
	t.Helper()
	var args []string
	list, _ := container(t, obj, name)["args"].([]any)
	for _, a := range list {
		args = append(args, a.(string))
	}
	return args
}

// projectedAudience is the audience of the NATS token the rendered
// workload projects into its pods.
func projectedAudience(t *testing.T, obj *unstructured.Unstructured) string {
	t.Helper()
	vols, _, _ := unstructured.NestedSlice(obj.Object, "spec", "template", "spec", "volumes")
	for _, v := range vols {
		srcs, _, _ := unstructured.NestedSlice(v.(map[string]any), "projected", "sources")
		for _, s := range srcs {
			if aud, ok, _ := unstructured.NestedString(s.(map[string]any), "serviceAccountToken", "audience"); ok {
				return aud
			}
		}
	}
	t.Fatalf("%s projects no ServiceAccount token", obj.GetName())
	return ""
}

// The chart's NATS, as it runs: the rendered nats.conf with the keys its
// init container makes, the auth callout with the arguments the chart
// gives it, envtest's API server reviewing the tokens, and the EPP
// consuming with its own token. A relay publishes its pod's events and
// they are indexed; a forger is refused, and the index answers for the
// pods what it answered before.
func TestTheChartsNATSAdmitsEachRelayForItsPodOnlyAndRefusesForgers(t *testing.T) {
	apiServer.Require(t)
	for i, tc := range []struct {
		name      string
		values    map[string]any
		jetStream bool
	}{
		{"core NATS, the defaults", nil, false},
		{"JetStream", map[string]any{"epp": map[string]any{"jetstream": true}, "nats": map[string]any{"jetstream": map[string]any{"enabled": true}}}, true},
		// One member of the three, its routes to the others unanswered:
		// its callout answers its own server's requests (--local-server).
		{"a member of a 3-node cluster", map[string]any{"nats": map[string]any{"cluster": map[string]any{"enabled": true}}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			chartNATSEndToEnd(t, fmt.Sprintf("callout-e2e-%d", i), tc.values, tc.jetStream)
		})
	}
}

func chartNATSEndToEnd(t *testing.T, ns string, values map[string]any, jetStream bool) {
	cs, err := kubernetes.NewForConfig(apiServer.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	objs := render(t, values, ns)
	sts := find(t, objs, "StatefulSet", "kv-kvroute-nats")
	var flags natscallout.Flags
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	flags.Register(fs)
	args := containerArgs(t, sts, "nats-auth")
	if args[0] != "serve" {
		t.Fatalf("the callout container runs %q", args)
	}
	if err := fs.Parse(args[1:]); err != nil {
		t.Fatalf("the callout rejects the chart's arguments %q: %v", args, err)
	}
	eppAudience := projectedAudience(t, find(t, objs, "Deployment", "kv-kvroute-epp"))
	relayAudience := projectedAudience(t, find(t, objs, "Deployment", "kv-kvroute-vllm"))
	if eppAudience != flags.Audience || relayAudience != flags.Audience {
		t.Fatalf("tokens are projected for %q (EPP) and %q (relays), the callout expects %q", eppAudience, relayAudience, flags.Audience)
	}

	// The ServiceAccounts as rendered, and pods running under them.
	for _, o := range objs {
		if o.GetKind() == "ServiceAccount" {
			var sa corev1.ServiceAccount
			sa.Name = o.GetName()
			if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &sa, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	pod := func(name, sa string) *corev1.Pod { return apiserver.PodUnder(t, cs, ns, name, sa) }
	tokenFile := func(p *corev1.Pod) string {
		return apiserver.TokenFile(t, cs, ns, p.Spec.ServiceAccountName, flags.Audience, p)
	}
	// The model servers carry the labels the chart's vLLM pods carry; the
	// callout admits relays of the pods its --pod-selector picks.
	selector, err := labels.Parse(flags.PodSelector)
	if err != nil || selector.Empty() {
		t.Fatalf("the callout's --pod-selector %q: %v", flags.PodSelector, err)
	}
	vllmLabels, _, _ := unstructured.NestedStringMap(find(t, objs, "Deployment", "kv-kvroute-vllm").Object, "spec", "template", "metadata", "labels")
	if !selector.Matches(labels.Set(vllmLabels)) {
		t.Fatalf("the callout's --pod-selector %q does not pick the chart's vLLM pods (%v)", flags.PodSelector, vllmLabels)
	}
	var poolSel map[string]string
	for _, o := range objs {
		if o.GetKind() == "InferencePool" {
			poolSel, _, _ = unstructured.NestedStringMap(o.Object, "spec", "selector", "matchLabels")
		}
	}
	if labels.SelectorFromSet(poolSel).String() != selector.String() {
		t.Fatalf("the callout's --pod-selector %q is not the InferencePool's %v", flags.PodSelector, poolSel)
	}
	poolPod := func(name string) *corev1.Pod {
		p := pod(name, flags.RelayServiceAccount)
		p.Labels = vllmLabels
		p, err := cs.CoreV1().Pods(ns).Update(ctx, p, metav1.UpdateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	vllm := []*corev1.Pod{poolPod("vllm-0"), poolPod("vllm-1")}
	eppPod := pod("epp-0", flags.EPPServiceAccount)

	// NATS, configured by the chart; only its listeners move to free ports.
	opts, dir := chartNATSOptions(t, objs, "kv-kvroute-nats")
	opts.Host, opts.Port, opts.HTTPPort, opts.NoLog, opts.NoSigs = "127.0.0.1", natsserver.RANDOM_PORT, 0, true, true
	if opts.Cluster.Port != 0 {
		opts.Cluster.Host, opts.Cluster.Port = "127.0.0.1", natsserver.RANDOM_PORT
		if !flags.LocalServer {
			t.Fatal("a cluster member's callout is not told to answer its own server alone")
		}
	}
	if opts.JetStream != jetStream {
		t.Fatalf("the chart's NATS has JetStream %t, want %t", opts.JetStream, jetStream)
	}
	if jetStream {
		opts.StoreDir = t.TempDir() // the pod's /data
	}
	url := serveNATS(t, opts).ClientURL()

	// The callout, as the chart runs it.
	issuer, password, err := natscallout.LoadKeys(filepath.Join(dir, "auth"))
	if err != nil {
		t.Fatal(err)
	}
	acnc, err := nats.Connect(url, nats.UserInfo(natscallout.AuthUser, password), nats.Timeout(testkit.WaitLimit))
	if err != nil {
		t.Fatalf("the callout's own user: %v", err)
	}
	t.Cleanup(acnc.Close)
	co := flags.Options
	co.Issuer = issuer
	// The callout asks the API server as its own ServiceAccount, with the
	// rights the chart grants it and no others.
	ccs := calloutClient(t, cs, objs, ns, "kv-kvroute-nats-auth")
	co.Reviewer = &natscallout.TokenReviewer{Client: ccs.AuthenticationV1(), Audience: flags.Audience}
	keys := natscallout.NewKeySet(ccs.Discovery().RESTClient(), natscallout.KeySetOptions{Refresh: flags.KeysRefresh})
	kctx, kcancel := context.WithCancel(ctx)
	t.Cleanup(kcancel)
	if err := keys.Start(kctx); err != nil {
		t.Fatal(err)
	}
	co.Signatures = keys
	// The issuer the API server's tokens name, as the callout reads it off
	// its own token in the cluster.
	own, err := natscallout.ParseToken(apiserver.Token(t, cs, ns, flags.EPPServiceAccount, flags.Audience, nil))
	if err != nil {
		t.Fatal(err)
	}
	co.TokenIssuer = own.Issuer
	pods := natscallout.NewPodLister(ccs, ns, selector)
	pctx, pcancel := context.WithCancel(ctx)
	t.Cleanup(func() { pcancel(); pods.Shutdown() })
	if err := pods.Start(pctx); err != nil {
		t.Fatal(err)
	}
	co.Pods = pods
	co.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	svc, err := natscallout.New(acnc, co)
	if err != nil {
		t.Fatal(err)
	}
	testkit.Go(t, "the auth callout", svc.Run)

	// The EPP, connecting with its own token, as the chart's Deployment
	// says.
	eppArgs := containerArgs(t, find(t, objs, "Deployment", "kv-kvroute-epp"), "epp")
	pool := ""
	for _, a := range eppArgs {
		if v, ok := strings.CutPrefix(a, "--pool-name="); ok {
			pool = v
		}
	}
	var inbox string
	env, _ := container(t, find(t, objs, "Deployment", "kv-kvroute-epp"), "epp")["env"].([]any)
	for _, e := range env {
		if m := e.(map[string]any); m["name"] == "NATS_INBOX_PREFIX" {
			inbox, _ = m["value"].(string)
		}
	}
	if inbox != events.EPPInboxPrefix {
		t.Fatalf("the EPP's NATS_INBOX_PREFIX is %q, the callout grants %s.>", inbox, events.EPPInboxPrefix)
	}
	auth := natsauth.Config{TokenFile: tokenFile(eppPod), InboxPrefix: inbox}
	natsOpts, err := auth.Options()
	if err != nil {
		t.Fatal(err)
	}
	if got := slices.Contains(eppArgs, "--jetstream"); got != jetStream {
		t.Fatalf("the EPP's --jetstream: %t, want %t", got, jetStream)
	}
	e, err := epp.New(epp.Options{
		NATSURL: url, NATSOptions: natsOpts, Namespace: ns, Pool: pool, HTTPAddr: "127.0.0.1:0", JetStream: jetStream,
		Prefix: prefixmatch.Params{DefaultBlockSizeTokens: 4},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	testkit.Go(t, "the EPP", e.Run)
	addrs := []string{"127.0.0.1:18000", "127.0.0.1:18001"}
	for i, p := range vllm {
		e.Datastore().Upsert(&datalayer.Endpoint{Name: p.Name, Address: addrs[i], Pod: p.Name, Namespace: ns, Model: "m"})
	}
	testkit.WaitFor(t, "the EPP to consume through the callout", func() error {
		if !e.Ready() {
			return errors.New("e.Ready() is false")
		}
		return nil
	})

	// Each relay publishes its pod's events with its pod's token.
	relayErrs := make([]chan error, len(vllm))
	relayConns := make([]*nats.Conn, len(vllm))
	prompts := make([][]uint32, len(vllm))
	for i, p := range vllm {
		a := natsauth.Config{TokenFile: tokenFile(p)}
		o, err := a.Options()
		if err != nil {
			t.Fatal(err)
		}
		relayErrs[i] = make(chan error, 8)
		ch := relayErrs[i]
		nc, err := nats.Connect(url, append(o, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			select {
			case ch <- err:
			default:
			}
		}))...)
		if err != nil {
			t.Fatalf("%s's relay: %v", p.Name, err)
		}
		t.Cleanup(nc.Close)
		relayConns[i] = nc
		engine := sim.NewEngine(sim.EngineConfig{Pod: p.Name, Address: addrs[i], Model: "m",
			Pool: blockpool.Config{BlockSize: 4, GPUBlocks: 64, Seed: uint64(i + 1)}}, events.NewPublisher(nc, ns, pool))
		prompts[i] = make([]uint32, 32)
		for j := range prompts[i] {
			prompts[i][j] = uint32(1000*(i+1) + j)
		}
		if _, err := engine.Serve(blockpool.Request{Tokens: prompts[i]}); err != nil {
			t.Fatal(err)
		}
	}
	answers := func() string {
		var b strings.Builder
		for i, prompt := range prompts {
			ans, err := e.Lookup(ctx, prefixquery.Query{Model: "m", TokenIDs: prompt})
			if err != nil {
				t.Fatal(err)
			}
			for _, a := range ans.Endpoints {
				fmt.Fprintf(&b, "prompt %d on %s: %d/%d blocks, %s; ", i, a.Name, a.Prefix.MatchBlocks, a.Prefix.TotalBlocks, a.Stream)
			}
		}
		return b.String()
	}
	want := "prompt 0 on vllm-0: 8/8 blocks, exact; prompt 0 on vllm-1: 0/8 blocks, exact; prompt 1 on vllm-0: 0/8 blocks, exact; prompt 1 on vllm-1: 8/8 blocks, exact; "
	testkit.WaitFor(t, "both relays' events indexed", func() error {
		if got := answers(); got != want {
			return errors.New(got)
		}
		return nil
	})

	cleared, err := events.AppendBatch(nil, &events.Batch{Events: []events.Event{{Kind: events.KindAllBlocksCleared}}}, events.EncodingArray)
	if err != nil {
		t.Fatal(err)
	}
	forged := events.Origin{Stream: events.Stream{Endpoint: addrs[1]}, Pod: "vllm-1", Instance: "forged", Seq: 1 << 40}
	// vllm-0's relay on vllm-1's subject: the server refuses it.
	if err := relayConns[0].PublishMsg(&nats.Msg{Subject: events.Subject(ns, pool, "vllm-1"), Header: forged.Header(), Data: cleared}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-relayErrs[0]:
		if !strings.Contains(strings.ToLower(err.Error()), "permissions violation") {
			t.Fatalf("vllm-0 publishing on vllm-1's subject: %v", err)
		}
	case <-time.After(testkit.WaitLimit):
		t.Fatal("the server let vllm-0's relay publish on vllm-1's subject")
	}
	// vllm-0's relay on its own subject, naming vllm-1's endpoint: the EPP
	// refuses it.
	forged.Pod = ""
	if err := relayConns[0].PublishMsg(&nats.Msg{Subject: events.Subject(ns, pool, "vllm-0"), Header: forged.Header(), Data: cleared}); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "the EPP to reject vllm-0 speaking for vllm-1", func() error {
		if seen := testkit.Value(t, e.Registry(), "kvroute_events_rejected_total", "reason", "endpoint_of_other_pod"); seen != 1 {
			return fmt.Errorf("testkit.Value(t, e.Registry(), \"kvroute_events_rejected_total\", \"reason\", \"endpoint_of_other_pod\") is %v, want %v", seen, 1)
		}
		return nil
	})
	// Nobody without a token of the pool's ServiceAccounts gets in.
	if nc, err := nats.Connect(url, nats.MaxReconnects(0)); err == nil {
		nc.Close()
		t.Fatal("a client without a token connected")
	}
	other := pod("intruder", "kv-kvroute-epp")
	otherOpts, _ := natsauth.Config{TokenFile: tokenFile(other)}.Options()
	intruderErrs := make(chan error, 4)
	intruder, err := nats.Connect(url, append(otherOpts, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { intruderErrs <- err }))...)
	if err != nil {
		t.Fatalf("a second EPP pod: %v", err)
	}
	defer intruder.Close()
	if err := intruder.PublishMsg(&nats.Msg{Subject: events.Subject(ns, pool, "vllm-1"), Header: forged.Header(), Data: cleared}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-intruderErrs:
		if !strings.Contains(strings.ToLower(err.Error()), "permissions violation") {
			t.Fatalf("an EPP publishing events: %v", err)
		}
	case <-time.After(testkit.WaitLimit):
		t.Fatal("the server let an EPP publish events")
	}
	if got := answers(); got != want {
		t.Fatalf("after the forgeries the index answers\n  %s\nwant\n  %s", got, want)
	}
	if got := testkit.Value(t, e.Registry(), "kvroute_index_events_applied_total", "kind", "AllBlocksCleared"); got != 0 {
		t.Errorf("%v forged AllBlocksCleared applied", got)
	}
}

// serveNATS runs a server with opts until the test ends.
func serveNATS(t *testing.T, opts *natsserver.Options) *natsserver.Server {
	t.Helper()
	srv, err := natsserver.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(testkit.WaitLimit) {
		t.Fatal("NATS not ready")
	}
	t.Cleanup(srv.Shutdown)
	return srv
}

// calloutClient applies the chart's RBAC objects and returns a client
// that acts as the callout's ServiceAccount sa: only the groups every
// authenticated subject has, so that what it may do is what the chart's
// bindings grant. It checks that they grant nothing beyond the callout's
// needs: no Secrets, no pods of other namespaces.
func calloutClient(t *testing.T, cs kubernetes.Interface, objs []*unstructured.Unstructured, ns, sa string) kubernetes.Interface {
	t.Helper()
	ctx := context.Background()
	for _, o := range objs {
		var err error
		switch o.GetKind() {
		case "ClusterRole":
			var r rbacv1.ClusterRole
			if err = runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &r); err == nil {
				_, err = cs.RbacV1().ClusterRoles().Create(ctx, &r, metav1.CreateOptions{})
			}
		case "ClusterRoleBinding":
			var b rbacv1.ClusterRoleBinding
			if err = runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &b); err == nil {
				_, err = cs.RbacV1().ClusterRoleBindings().Create(ctx, &b, metav1.CreateOptions{})
			}
		case "Role":
			var r rbacv1.Role
			if err = runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &r); err == nil {
				_, err = cs.RbacV1().Roles(ns).Create(ctx, &r, metav1.CreateOptions{})
			}
		case "RoleBinding":
			var b rbacv1.RoleBinding
			if err = runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &b); err == nil {
				_, err = cs.RbacV1().RoleBindings(ns).Create(ctx, &b, metav1.CreateOptions{})
			}
		}
		if err != nil {
			t.Fatalf("%s/%s: %v", o.GetKind(), o.GetName(), err)
		}
	}
	cfg := rest.CopyConfig(apiServer.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + ns + ":" + sa, Groups: []string{"system:authenticated"}}
	ccs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// RBAC is read from an informer: wait until the bindings apply.
	testkit.WaitFor(t, "the chart's RBAC to grant the callout its key set", func() error {
		if b, err := ccs.Discovery().RESTClient().Get().AbsPath(natscallout.JWKSPath).DoRaw(ctx); err != nil {
			return fmt.Errorf("GET %s as %s: %w (%q)", natscallout.JWKSPath, sa, err, b)
		}
		return nil
	})
	if _, err := ccs.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the callout lists Secrets: %v, want forbidden", err)
	}
	if _, err := ccs.CoreV1().Pods("default").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the callout lists another namespace's pods: %v, want forbidden", err)
	}
	return ccs
}
