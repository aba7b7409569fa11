package consumer

import (
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/testkit"
)

// members is a pool as discovery would report it: testOrigin(1) and
// testOrigin(2) are the endpoints of vllm-1 and vllm-2.
func members() Membership {
	pods := map[string]string{
		testOrigin(1, 0, "").Endpoint: "vllm-1",
		testOrigin(2, 0, "").Endpoint: "vllm-2",
	}
	return MembershipFunc(func(addr string) (string, bool) {
		p, ok := pods[addr]
		return p, ok
	})
}

func TestConsumerBindsEveryBatchToThePodItsSubjectNames(t *testing.T) {
	t.Parallel()
	for _, tr := range []transport{transports[0], transports[2]} {
		t.Run(tr.name, func(t *testing.T) {
			t.Parallel()
			const ns, pool = "ns", "pool"
			env := newNATSEnv(t, tr.jetStream, tr.inProc)
			nc := env.connect(t, "consumer")
			if tr.jetStream {
				env.ensureStream(t, nc, ns, pool)
			}
			logs := &logCounter{n: map[string]int{}}
			rec := &sinkRecorder{}
			c := newTestConsumer(t, nc, Options{Namespace: ns, Pool: pool, JetStream: tr.jetStream,
				Membership: members(), Logger: slog.New(logs)}, rec)
			runConsumer(t, c)
			pc := env.connect(t, "publisher")
			send := func(pod string, o events.Origin) {
				t.Helper()
				msg := &nats.Msg{Subject: events.Subject(ns, pool, pod), Header: o.Header(), Data: encodeBatch(t, testBatch(1, o.Seq, 2, 4))}
				if err := pc.PublishMsg(msg); err != nil {
					t.Fatal(err)
				}
			}
			victim := testOrigin(1, 0, "real") // vllm-1's endpoint
			forged := func(edit func(o *events.Origin)) events.Origin {
				o := victim
				o.Instance, o.Seq = "forged", 1<<40
				edit(&o)
				return o
			}
			attacks := []struct {
				name, subjectPod string
				origin           events.Origin
				reason           string
			}{
				{"a pod not in the pool claims a member's endpoint", "evil", forged(func(o *events.Origin) { o.Pod = "" }), "endpoint_of_other_pod"},
				{"a pod not in the pool names the victim in Kv-Pod", "evil", forged(func(*events.Origin) {}), "pod_mismatch"},
				{"another member claims the victim's endpoint under its own name", "vllm-2", forged(func(o *events.Origin) { o.Pod = "vllm-2" }), "endpoint_of_other_pod"},
				{"another member claims the victim's endpoint under the victim's name", "vllm-2", forged(func(*events.Origin) {}), "pod_mismatch"},
				{"the victim's subject with an endpoint outside the pool", "vllm-1", forged(func(o *events.Origin) { o.Endpoint = "10.9.9.9:8000" }), "unknown_endpoint"},
			}
			send("vllm-1", victim)
			for _, a := range attacks {
				send(a.subjectPod, a.origin)
			}
			// A subject of more levels than the contract's: a publisher that
			// skipped sanitising, or someone hoping to look like a pod.
			if err := pc.PublishMsg(&nats.Msg{Subject: "kv.events." + ns + "." + pool + ".vllm-1.extra", Header: forged(func(*events.Origin) {}).Header(),
				Data: encodeBatch(t, testBatch(1, 0, 2, 4))}); err != nil {
				t.Fatal(err)
			}
			next := victim
			next.Seq = 1
			send("vllm-1", next)

			testkit.WaitFor(t, "the victim's second batch", func() error {
				if seen := len(applied(rec.of(victim.Stream))); seen != 2 {
					return fmt.Errorf("len(applied(rec.of(victim.Stream))) is %v, want %v", seen, 2)
				}
				return nil
			})
			var got []string
			for _, call := range rec.snapshot() {
				got = append(got, call.String())
			}
			want := []string{"apply " + victim.Stream.String() + " seq=0 inst=real", "apply " + victim.Stream.String() + " seq=1 inst=real"}
			if !slices.Equal(got, want) {
				t.Fatalf("the sink saw\n  %q\nwant only the victim's own batches\n  %q", got, want)
			}
			wantReasons := map[string]float64{"bad_subject": 1}
			for _, a := range attacks {
				wantReasons[a.reason]++
			}
			for reason, n := range wantReasons {
				if got := testutil.ToFloat64(c.admit.vec.WithLabelValues(reason)); got != n {
					t.Errorf("rejected_total{reason=%q} = %v, want %v", reason, got, n)
				}
			}
			if got := testutil.ToFloat64(c.m.applied); got != 2 {
				t.Errorf("batches_total{applied} = %v, want 2: rejected batches are not counted applied", got)
			}
			total := 0
			for _, r := range rejectionNames[1:] {
				total += logs.get(r)
			}
			if total < 1 || total >= len(attacks)+1 {
				t.Errorf("%d log lines for %d rejections, want rate-limited", total, len(attacks)+1)
			}
		})
	}
}

func TestConsumerCapsTheDataParallelStreamsOfAnEndpoint(t *testing.T) {
	t.Parallel()
	const ns, pool, maxRanks, forged = "ns", "pool", 3, 500
	env := newNATSEnv(t, false, false)
	rec := &sinkRecorder{}
	c := newTestConsumer(t, env.connect(t, "consumer"), Options{Namespace: ns, Pool: pool, Membership: members(), MaxRanksPerEndpoint: maxRanks}, rec)
	runConsumer(t, c)
	pub := events.NewPublisher(env.connect(t, "publisher"), ns, pool)
	for rank := range forged {
		o := testOrigin(1, 0, "i")
		o.DPRank = rank * 7919 // ranks need not be small, only few
		if err := pub.Publish(o, encodeBatch(t, testBatch(1, 0, 1, 4))); err != nil {
			t.Fatal(err)
		}
	}
	// vllm-2 has ranks of its own.
	other := testOrigin(2, 0, "i")
	if err := pub.Publish(other, encodeBatch(t, testBatch(2, 0, 1, 4))); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "vllm-2's batch", func() error {
		if seen := len(applied(rec.of(other.Stream))); seen != 1 {
			return fmt.Errorf("len(applied(rec.of(other.Stream))) is %v, want %v", seen, 1)
		}
		return nil
	})
	testkit.WaitFor(t, "every rejection counted", func() error {
		if seen := testutil.ToFloat64(c.admit.vec.WithLabelValues("rank_limit")); seen != forged-maxRanks {
			return fmt.Errorf("testutil.ToFloat64(c.admit.vec.WithLabelValues(\"rank_limit\")) is %v, want %v", seen, forged-maxRanks)
		}
		return nil
	})
	streams := map[events.Stream]bool{}
	for _, call := range rec.snapshot() {
		streams[call.stream] = true
	}
	if len(streams) != maxRanks+1 {
		t.Fatalf("the sink heard of %d streams, want %d of vllm-1 and vllm-2's one", len(streams), maxRanks+1)
	}
	for r := range maxRanks {
		s := events.Stream{Endpoint: testOrigin(1, 0, "").Endpoint, DPRank: r * 7919}
		if !streams[s] {
			t.Errorf("the first ranks are admitted: %s is missing", s)
		}
	}
}

func TestAdmitterForgetsTheRanksOfEndpointsThatLeft(t *testing.T) {
	t.Parallel()
	pool := map[string]string{}
	a := newAdmitter(MembershipFunc(func(addr string) (string, bool) {
		p, ok := pool[addr]
		return p, ok
	}), 2, time.Hour)
	now := time.Unix(1000, 0)
	const n = 10_000
	for i := range n {
		addr := fmt.Sprintf("10.0.%d.%d:80", i/250, i%250)
		pod := fmt.Sprintf("pod-%d", i)
		pool[addr] = pod
		o := events.Origin{Stream: events.Stream{Endpoint: addr}, Pod: pod}
		if r := a.admit(events.Subject("ns", "p", pod), &o, now); r != admitted {
			t.Fatalf("member %s: %s", addr, rejectionNames[r])
		}
		delete(pool, addr) // the pod leaves at once: churn
	}
	if len(a.ranks) > 128 {
		t.Fatalf("%d endpoints' ranks kept after %d came and went, want the departed swept", len(a.ranks), n)
	}
}

func TestAdmitterFillsInThePodFromDiscovery(t *testing.T) {
	t.Parallel()
	a := newAdmitter(members(), 2, time.Hour)
	o := testOrigin(1, 0, "")
	o.Pod = ""
	if r := a.admit(events.Subject("ns", "p", "vllm-1"), &o, time.Now()); r != admitted {
		t.Fatalf("rejected: %s", rejectionNames[r])
	}
	if o.Pod != "vllm-1" {
		t.Errorf("Pod = %q, want discovery's vllm-1", o.Pod)
	}
	// A pod name with dots becomes one token with underscores, and still
	// matches.
	b := newAdmitter(MembershipFunc(func(string) (string, bool) { return "web.v2", true }), 2, time.Hour)
	o = testOrigin(1, 0, "")
	o.Pod = "web.v2"
	if subj := events.Subject("ns", "p", "web.v2"); !strings.HasSuffix(subj, ".web_v2") {
		t.Fatalf("subject %s", subj)
	}
	if r := b.admit(events.Subject("ns", "p", "web.v2"), &o, time.Now()); r != admitted {
		t.Errorf("a sanitised pod name: rejected as %s", rejectionNames[r])
	}
}

// FuzzAdmit runs an event message's subject and headers, as anyone who
// can publish makes them, through what the consumer checks before
// queueing. No input may panic; what is admitted is bound to its subject's
// pod, which discovery gives its endpoint, and within the rank bound.
func FuzzAdmit(f *testing.F) {
	f.Add("kv.events.ns.pool.vllm-1", "10.0.0.2:8000", "vllm-1", "0", "0", "inst")
	f.Add("kv.events.ns.pool.evil", "10.0.0.2:8000", "", "7", "1", "")
	f.Add("kv.events.ns.pool.vllm-2", "10.0.0.2:8000", "vllm-1", "1", "99999", "x")
	f.Add("kv.events.ns.pool.a.b", "10.0.0.3:8000", "a.b", "", "-1", "")
	f.Add("kv.events..pool.", "[::1]:1", "\x00", "18446744073709551615", "2147483647", "\xff")
	f.Fuzz(func(t *testing.T, subject, endpoint, pod, seq, rank, instance string) {
		h := nats.Header{events.HeaderEndpoint: {endpoint}, events.HeaderSeq: {seq}, events.HeaderPod: {pod}, events.HeaderInstance: {instance}}
		if rank != "" {
			h.Set(events.HeaderDPRank, rank)
		}
		o, err := events.ParseOrigin(h)
		if err != nil {
			return
		}
		a := newAdmitter(members(), 2, time.Hour)
		if r := a.admit(subject, &o, time.Now()); r != admitted {
			if int(r) >= len(rejectionNames) || rejectionNames[r] == "" {
				t.Fatalf("rejection %d has no name", r)
			}
			return
		}
		_, _, subjectPod, ok := events.ParseSubject(subject)
		owner, member := members().PodOf(o.Endpoint)
		if !ok || !member || events.SubjectToken(owner) != subjectPod || events.SubjectToken(o.Pod) != subjectPod {
			t.Fatalf("admitted %+v on %q: subject pod %q, discovery's %q", o, subject, subjectPod, owner)
		}
		if n := len(a.ranks[o.Endpoint].ranks); n > 2 {
			t.Fatalf("%d ranks kept", n)
		}
	})
}

// Large batches wait in the NATS client, not in the workers' queues, once
// the queues hold MaxQueuedBytes: a publisher of huge batches cannot make
// the consumer hold a queue length of them.
func TestQueuedPayloadsStayWithinTheirByteBound(t *testing.T) {
	t.Parallel()
	env := newNATSEnv(t, false, true)
	rec := &sinkRecorder{block: make(chan struct{})}
	const bound, size = 1 << 20, 300 << 10
	c := newTestConsumer(t, env.connect(t, "consumer"), Options{Namespace: "ns", Pool: "pool", Workers: 1, QueueLen: 1024, MaxQueuedBytes: bound}, rec)
	runConsumer(t, c)
	pc := env.connect(t, "publisher")
	pub := events.NewPublisher(pc, "ns", "pool")
	big := testBatch(1, 0, size/(4*16), 16) // 16-token blocks of 4-byte-ish ids
	for seq := range uint64(40) {
		b := *big
		if err := pub.Publish(testOrigin(1, seq, "i"), encodeBatch(t, &b)); err != nil {
			t.Fatal(err)
		}
	}
	if err := pc.Flush(); err != nil {
		t.Fatal(err)
	}
	// The sink holds the first batch; the rest wait in the queue up to the
	// bound, then in the client.
	testkit.WaitFor(t, "the client to hold what the queue may not", func() error {
		n, _, _ := c.sub.Load().Pending()
		if n <= 20 {
			return fmt.Errorf("n is %v, want > %v", n, 20)
		}
		return nil
	})
	if n := len(c.queues[0]); n*size > bound+size {
		t.Errorf("%d batches of %d KiB queued, over the bound of %d KiB", n, size>>10, bound>>10)
	}
	close(rec.block)
	s := testOrigin(1, 0, "").Stream
	testkit.WaitFor(t, "every batch applied", func() error {
		if seen := len(applied(rec.of(s))); seen != 40 {
			return fmt.Errorf("len(applied(rec.of(s))) is %v, want %v", seen, 40)
		}
		return nil
	})
}
