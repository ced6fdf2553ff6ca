package queue_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/internal/apitest"
	"github.com/chargeonce/chargeonce/queue"
)

// TestPoisonMerchantInSubject (issue 18.8): a subject whose merchant token
// no merchant can have (not UTF-8, not visible ASCII, a colon, too long) is
// poison, not a database outage: its 400 result and its dead-letter copy
// come at the first delivery, and nothing is charged.
func TestPoisonMerchantInSubject(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.worker(queue.WorkerOptions{})
	bad := []string{"\xff\xfebad", "caf\u00e9", "a:b", strings.Repeat("m", 256)}
	for i, m := range bad {
		msg := nats.NewMsg(queue.RequestSubject(m))
		msg.Header.Set(queue.HeaderIdempotencyKey, fmt.Sprintf("k-%d", i))
		msg.Data = []byte(body(int64(70+i), "tok_ok"))
		if _, err := e.js.PublishMsg(t.Context(), msg); err != nil {
			t.Fatalf("publishing for merchant %q: %v", m, err)
		}
	}
	start := time.Now()
	var results, dead []stored
	apitest.Eventually(t, 15*time.Second, "a 400 result and a dead letter for every bad merchant", func() bool {
		results = messages(t, e.js, queue.ResultSubjectPrefix+"*")
		dead = messages(t, e.js, queue.DeadSubjectPrefix+"*")
		return len(results) >= len(bad) && len(dead) >= len(bad)
	})
	t.Logf("answered in %s", time.Since(start).Round(time.Millisecond))
	bySubject := map[string]stored{}
	for _, r := range append(results, dead...) {
		bySubject[r.subject] = r
	}
	for _, m := range bad {
		r, d := bySubject[queue.ResultSubject(m)], bySubject[queue.DeadSubject(m)]
		if r.status() != "400" || !strings.Contains(string(r.body), chargeonce.EINVALID) {
			t.Fatalf("merchant %q: result %s %s; want 400 validation-failed on its result subject", m, r.status(), r.body)
		}
		if d.header.Get(queue.HeaderDeadReason) != chargeonce.EINVALID {
			t.Fatalf("merchant %q: dead letter reason %q", m, d.header.Get(queue.HeaderDeadReason))
		}
	}
	consumerDrained(t, e.js, queue.DefaultDurable, 10*time.Second)
	if st := e.acq.sim.Stats(); st.CaptureRequests != 0 {
		t.Fatalf("the acquirer saw %d requests", st.CaptureRequests)
	}
}

// TestMsgIDNotSharedAcrossMerchants (issue 17.5): JetStream dedupes
// Nats-Msg-Id across the whole stream, whatever the subject. Acme's message
// must not make beta's, sent a moment later with the same id, disappear:
// the request stream's duplicate window is the shortest JetStream allows
// (the engine dedupes by merchant and key anyway), and both get results.
func TestMsgIDNotSharedAcrossMerchants(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.worker(queue.WorkerOptions{})
	send := func(m string, order int64) {
		msg := nats.NewMsg(queue.RequestSubject(m))
		msg.Header.Set(queue.HeaderIdempotencyKey, "order-1")
		msg.Header.Set(jetstream.MsgIDHeader, "order-1")
		msg.Data = []byte(body(order, "tok_ok"))
		ack, err := e.js.PublishMsg(t.Context(), msg)
		if err != nil {
			t.Fatalf("publishing for %s: %v", m, err)
		}
		if ack.Duplicate {
			t.Errorf("%s's message was dropped as a duplicate of another merchant's (stream sequence %d)", m, ack.Sequence)
		}
	}
	send("acme", 81)
	time.Sleep(500 * time.Millisecond) // past the shortest window JetStream allows (100 ms), not the default (2 min)
	send("beta", 82)
	for _, m := range []string{"acme", "beta"} {
		apitest.Eventually(t, 15*time.Second, m+"'s result", func() bool {
			rs := messages(t, e.js, queue.ResultSubject(m))
			return len(rs) == 1 && rs[0].status() == "201"
		})
		if n := e.acq.sim.CapturedCount(m, map[string]int64{"acme": 81, "beta": 82}[m]); n != 1 {
			t.Fatalf("%s: %d captures, want 1", m, n)
		}
	}
}

// TestStreamsBoundedDeadLetterTruncated (issue 17.7): both streams have
// limits, and a huge poison message is copied to charges.dead truncated to
// 64 KiB, with a header giving its original size.
func TestStreamsBoundedDeadLetterTruncated(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.worker(queue.WorkerOptions{})
	for _, name := range []string{queue.RequestStream, queue.ResultStream} {
		s, err := e.js.Stream(t.Context(), name)
		if err != nil {
			t.Fatal(err)
		}
		c := s.CachedInfo().Config
		t.Logf("%s: MaxBytes %d, MaxAge %s, MaxMsgSize %d, Discard %s", name, c.MaxBytes, c.MaxAge, c.MaxMsgSize, c.Discard)
		if c.MaxBytes <= 0 || c.MaxAge <= 0 || c.MaxMsgSize <= 0 {
			t.Errorf("%s is unbounded: MaxBytes %d, MaxAge %s, MaxMsgSize %d", name, c.MaxBytes, c.MaxAge, c.MaxMsgSize)
		}
	}
	const size = 900_000
	huge := `{"order_id": 1, "description": "` + strings.Repeat("x", size) + `"}`
	e.send("huge", huge[:size], "")
	var dead []stored
	apitest.Eventually(t, 20*time.Second, "the dead letter", func() bool {
		dead = messages(t, e.js, queue.DeadSubject(merchant))
		return len(dead) == 1
	})
	d := dead[0]
	if len(d.body) != queue.DeadMaxBody || d.header.Get(queue.HeaderDeadTruncated) != fmt.Sprint(size) || string(d.body) != huge[:queue.DeadMaxBody] {
		t.Fatalf("dead letter of %d bytes, %s=%q; want the first %d bytes and the original size %d", len(d.body), queue.HeaderDeadTruncated, d.header.Get(queue.HeaderDeadTruncated), queue.DeadMaxBody, size)
	}
	consumerDrained(t, e.js, queue.DefaultDurable, 10*time.Second)
}
