package recovery_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/ingest/relay"
	"github.com/kvroute/kvroute/pkg/testkit"
	"github.com/kvroute/kvroute/pkg/transport/natsauth"
	"github.com/kvroute/kvroute/pkg/transport/natsembed"
)

// authServer is a NATS server with the authorization docs/security.md
// describes: each relay may publish only its own pod's event subject and
// answer only its own pod's snapshot requests; the EPP may subscribe to
// the pool's events and request snapshots, and publish nothing else.
func authServer(pods ...string) func(t testing.TB, port int) *natsembed.Server {
	return func(t testing.TB, port int) *natsembed.Server {
		t.Helper()
		users := []*server.User{{
			Username: "epp", Password: "epp-pw",
			Permissions: &server.Permissions{
				Publish:   &server.SubjectPermission{Allow: []string{events.SnapshotSubjectPrefix + "." + testNS + "." + testPool + ".*"}},
				Subscribe: &server.SubjectPermission{Allow: []string{events.PoolSubject(testNS, testPool), "_INBOX.>"}},
			},
		}}
		for _, pod := range pods {
			users = append(users, &server.User{
				Username: "relay-" + pod, Password: "pw-" + pod,
				Permissions: &server.Permissions{
					Publish:   &server.SubjectPermission{Allow: []string{events.Subject(testNS, testPool, pod)}},
					Subscribe: &server.SubjectPermission{Allow: []string{events.SnapshotSubject(testNS, testPool, pod)}},
					// A snapshot is many replies to one request.
					Response: &server.ResponsePermission{MaxMsgs: 1 << 16, Expires: time.Minute},
				},
			})
		}
		s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: port, NoLog: true, NoSigs: true, Users: users, MaxPayload: 8 << 20})
		if err != nil {
			t.Fatal(err)
		}
		s.Start()
		if !s.ReadyForConnections(10 * time.Second) {
			t.Fatal("server not ready")
		}
		return &natsembed.Server{Server: s}
	}
}

func waitViolation(t *testing.T, errs <-chan error, what string) {
	t.Helper()
	select {
	case err := <-errs:
		if !strings.Contains(strings.ToLower(err.Error()), "permissions violation") {
			t.Fatalf("%s: error %v, want a permissions violation", what, err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: the server allowed it", what)
	}
}

func TestAuthorizationConfinesEachRelayToItsPodAndTheEPPStillWorks(t *testing.T) {
	w := newWorld(t, worldOptions{
		pods:   2,
		server: authServer("vllm-0", "vllm-1"),
		relayAuth: func(pod string) relay.NATSOptions {
			return relay.NATSOptions{Auth: natsauth.Config{User: "relay-" + pod, Password: "pw-" + pod}}
		},
	})
	w.serve(100)
	// An EPP that joins late must resync from snapshots, through the
	// permissions, to match.
	eppErrs := make(chan error, 4)
	st := w.newStack(stackOptions{natsOpts: []nats.Option{nats.UserInfo("epp", "epp-pw")}, errs: eppErrs})
	w.converge(st)
	if got := testkit.Value(t, st.reg, "kvroute_recovery_resyncs_total", "result", "ok"); got < 2 {
		t.Fatalf("resyncs ok = %v, want one per relay", got)
	}

	rogueErrs := make(chan error, 4)
	rogue, err := nats.Connect(w.url(), nats.UserInfo("relay-vllm-0", "pw-vllm-0"),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { rogueErrs <- err }))
	if err != nil {
		t.Fatal(err)
	}
	defer rogue.Close()
	pub := events.NewPublisher(rogue, testNS, testPool)
	cleared, err := events.AppendBatch(nil, &events.Batch{Events: []events.Event{{Kind: events.KindAllBlocksCleared}}}, events.EncodingArray)
	if err != nil {
		t.Fatal(err)
	}
	victim := w.slots[1]
	// Another pod's subject: refused by the server.
	if err := pub.Publish(events.Origin{Stream: events.Stream{Endpoint: victim.addr}, Pod: victim.pod, Seq: 1 << 40}, cleared); err != nil {
		t.Fatal(err)
	}
	waitViolation(t, rogueErrs, "relay-vllm-0 publishing vllm-1's events")
	// Another pod's snapshot requests: refused too.
	if _, err := rogue.Subscribe(events.SnapshotSubject(testNS, testPool, victim.pod), func(*nats.Msg) {}); err != nil {
		t.Fatal(err)
	}
	waitViolation(t, rogueErrs, "relay-vllm-0 answering vllm-1's snapshots")

	// Its own subject is allowed, but headers naming an endpoint that is
	// not a member of the pool are not indexed. Published after the
	// refused batch on the same connection, its arrival also shows that
	// the refused one never reached the EPP.
	const stranger = "127.0.0.1:9998"
	stored, err := events.AppendBatch(nil, &events.Batch{Events: []events.Event{{Kind: events.KindBlockStored,
		BlockHashes: []uint64{1}, TokenIDs: w.prompt[0].Tokens[:blockSize], BlockSize: blockSize}}}, events.EncodingArray)
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish(events.Origin{Stream: events.Stream{Endpoint: stranger}, Pod: "vllm-0", Model: testModel, Seq: 0}, stored); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "the non-member's batch to reach the index", func() error {
		if seen := testkit.Value(t, st.reg, "kvroute_index_events_dropped_total", "reason", "unknown_endpoint"); seen <= 0 {
			return fmt.Errorf("testkit.Value(t, st.reg, \"kvroute_index_events_dropped_total\", \"reason\", \"unknown_endpoint\") is %v, want > %v", seen, 0)
		}
		return nil
	})
	if got := testkit.Value(t, st.reg, "kvroute_index_events_applied_total", "kind", "AllBlocksCleared"); got != 0 {
		t.Fatalf("the refused AllBlocksCleared was applied %v times", got)
	}
	if m := w.mismatch(st); m != "" {
		t.Fatalf("index after the rogue publishes: %s", m)
	}

	// The EPP publishes no events either.
	if err := events.NewPublisher(st.nc, testNS, testPool).Publish(events.Origin{Stream: events.Stream{Endpoint: victim.addr}, Pod: victim.pod}, cleared); err != nil {
		t.Fatal(err)
	}
	waitViolation(t, eppErrs, "the EPP publishing events")

	// And the path keeps working.
	w.serve(40)
	w.converge(st)
}
