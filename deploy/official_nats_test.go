package deploy

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/testkit"
	"github.com/kvroute/kvroute/pkg/transport/natscallout"
)

// The official NATS chart's values in deploy/examples give the EPP the
// rights kvroute's callout gives it and the relays those of any pod of the
// pool, and a real server run with that configuration enforces them: a
// relay publishes its pool's events and nothing else, the EPP receives
// them and publishes none.
func TestTheOfficialNATSChartValuesCarryKvroutesSubjectRights(t *testing.T) {
	t.Parallel()
	const ns, pool = "llm", "pool"
	v := readValues(t, "examples/official-nats-values.yaml")
	users, _ := lookup(v, "config.merge.accounts.KV.users")
	list, _ := users.([]any)
	rights := map[string]map[string]any{}
	for _, u := range list {
		m, _ := u.(map[string]any)
		name, _ := m["user"].(string)
		rights[name], _ = m["permissions"].(map[string]any)
	}
	list2 := func(user, dir, kind string) []string {
		d, _ := rights[user][dir].(map[string]any)
		var out []string
		raw, _ := d[kind].([]any)
		for _, s := range raw {
			out = append(out, s.(string))
		}
		return out
	}
	allow := func(user, dir string) []string { return list2(user, dir, "allow") }
	epp := natscallout.EPPPermissions(ns, pool, true, "")
	if got := list2("kvroute-epp", "publish", "deny"); !slices.Equal(got, epp.Pub.Deny) {
		t.Errorf("the EPP is denied %v; the callout denies %v", got, epp.Pub.Deny)
	}
	if got := allow("kvroute-epp", "publish"); !slices.Equal(got, epp.Pub.Allow) {
		t.Errorf("the EPP may publish %v; the callout gives %v", got, epp.Pub.Allow)
	}
	if got := allow("kvroute-epp", "subscribe"); !slices.Equal(got, epp.Sub.Allow) {
		t.Errorf("the EPP may subscribe to %v; the callout gives %v", got, epp.Sub.Allow)
	}
	anyPod := func(s string) string { return strings.TrimSuffix(s, "_") + "*" }
	relay := natscallout.RelayPermissions(ns, pool, "x")
	if got, want := allow("kvroute-relay", "publish"), anyPod(events.Subject(ns, pool, "_")); len(got) != 1 || got[0] != want || len(relay.Pub.Allow) != 1 {
		t.Errorf("a relay may publish %v, want [%s]", got, want)
	}
	if got, want := allow("kvroute-relay", "subscribe"), anyPod(events.SnapshotSubject(ns, pool, "_")); len(got) != 1 || got[0] != want {
		t.Errorf("a relay may subscribe to %v, want [%s]", got, want)
	}

	// The merged configuration, as the chart writes it, the secrets' values
	// in place of its variables.
	merge, _ := lookup(v, "config.merge")
	var text strings.Builder
	enc := json.NewEncoder(&text)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(merge); err != nil {
		t.Fatal(err)
	}
	conf := strings.NewReplacer("<< $KVROUTE_EPP_PASSWORD >>", "epp-secret", "<< $KVROUTE_RELAY_PASSWORD >>", "relay-secret").Replace(strings.TrimSpace(text.String()))
	path := filepath.Join(t.TempDir(), "nats.conf")
	if err := os.WriteFile(path, []byte("listen: 127.0.0.1:-1\n"+strings.TrimSuffix(strings.TrimPrefix(conf, "{"), "}")), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := natsserver.ProcessConfigFile(path)
	if err != nil {
		t.Fatalf("nats-server rejects the example's configuration: %v\n%s", err, conf)
	}
	opts.NoLog, opts.NoSigs = true, true
	srv := serveNATS(t, opts)
	violations := make(chan error, 8)
	connect := func(user, password string) *nats.Conn {
		nc, err := nats.Connect(srv.ClientURL(), nats.UserInfo(user, password), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			violations <- err
		}))
		if err != nil {
			t.Fatalf("%s: %v", user, err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	eppConn, relayConn := connect("kvroute-epp", "epp-secret"), connect("kvroute-relay", "relay-secret")
	sub, err := eppConn.SubscribeSync(events.PoolSubject(ns, pool))
	if err != nil {
		t.Fatal(err)
	}
	if err := eppConn.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := relayConn.Publish(events.Subject(ns, pool, "vllm-0"), []byte("batch")); err != nil {
		t.Fatal(err)
	}
	if _, err := sub.NextMsg(testkit.WaitLimit); err != nil {
		t.Fatalf("a relay's batch never reached the EPP: %v", err)
	}
	// The replicas share their dispatches on the pool's dispatch subject.
	shared, err := eppConn.SubscribeSync(events.DispatchSubject(ns, pool))
	if err != nil {
		t.Fatal(err)
	}
	if err := eppConn.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := eppConn.Publish(events.DispatchSubject(ns, pool), []byte("dispatches")); err != nil {
		t.Fatal(err)
	}
	if _, err := shared.NextMsg(testkit.WaitLimit); err != nil {
		t.Fatalf("a replica's dispatches never reached the replicas: %v", err)
	}
	for _, tc := range []struct {
		who  string
		nc   *nats.Conn
		subj string
	}{
		{"a relay publishing another pool's events", relayConn, events.Subject(ns, "other", "vllm-0")},
		{"the EPP publishing events", eppConn, events.Subject(ns, pool, "vllm-0")},
		{"a relay publishing dispatches", relayConn, events.DispatchSubject(ns, pool)},
		{"the EPP publishing another pool's dispatches", eppConn, events.DispatchSubject(ns, "other")},
	} {
		if err := tc.nc.Publish(tc.subj, []byte("forged")); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-violations:
			if !strings.Contains(strings.ToLower(err.Error()), "permissions violation") {
				t.Errorf("%s: %v, want a permissions violation", tc.who, err)
			}
		case <-time.After(testkit.WaitLimit):
			t.Errorf("%s: the server allowed it", tc.who)
		}
	}
}
