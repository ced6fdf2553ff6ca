package queue_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/internal/apitest"
	"github.com/chargeonce/chargeonce/queue"
	"github.com/chargeonce/chargeonce/recovery"
)

// captured charges order over HTTP and returns the captured charge's id.
func (e *env) captured(key string, order int64) string {
	e.t.Helper()
	r := apitest.Charge(e.t, e.http.URL, key, body(order, "tok_ok"))
	var ch struct{ ID, Status string }
	if err := json.Unmarshal(r.Body, &ch); err != nil || r.Status != 201 || ch.Status != "captured" {
		e.t.Fatalf("charge %s: %d %s", key, r.Status, r.Body)
	}
	return ch.ID
}

// refundOverHTTP posts a refund with key, as a client would.
func (e *env) refundOverHTTP(chargeID, key, body string) apitest.Result {
	e.t.Helper()
	r, err := apitest.Do(e.t, nil, "POST", e.http.URL+"/v1/charges/"+chargeID+"/refunds", []byte(body), map[string]string{"Idempotency-Key": key})
	if err != nil {
		e.t.Fatal(err)
	}
	return r
}

// TestQueueRefunds: a request carrying Chargeonce-Refund-Of is a refund of
// that charge through the engine's Refund: its result is published as a
// charge's (201 with the refund, the same bytes HTTP replays for the key),
// a repeat replays it, and a refund past what remains, of an unknown
// charge, or malformed, gets the HTTP API's problem as this message's
// result. Ten concurrent refund messages of what remains: exactly one
// succeeds.
func TestQueueRefunds(t *testing.T) {
	t.Parallel()
	e := setup(t)
	seen := countingSub(t, e.nc)
	e.worker(queue.WorkerOptions{})
	ch := e.captured("rf-charge", 31)

	e.send("rf-a", `{"amount_cents":1000,"reason":"requested_by_customer"}`, "", queue.HeaderRefundOf, ch)
	g := e.waitResults(20*time.Second, "rf-a")
	a := g["rf-a"][0]
	var rf struct{ ID, ChargeID, Status string }
	if err := json.Unmarshal(a.body, &rf); err != nil || a.status() != "201" || rf.Status != "succeeded" || !strings.HasPrefix(rf.ID, "re_") {
		t.Fatalf("refund over the queue: %s %s; want 201 succeeded", a.status(), a.body)
	}
	if h := e.refundOverHTTP(ch, "rf-a", `{"amount_cents":1000,"reason":"requested_by_customer"}`); h.Status != 201 || !bytes.Equal(h.Body, a.body) || h.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("HTTP after the queue: %d %s; want the queue's bytes %s, replayed", h.Status, h.Body, a.body)
	}
	// A repeat of the message replays (published again under the same
	// Nats-Msg-Id, so the stream keeps one copy; a subscriber sees both);
	// a refund over HTTP first is replayed by the queue.
	e.send("rf-a", `{"amount_cents":1000,"reason":"requested_by_customer"}`, "", queue.HeaderRefundOf, ch)
	h := e.refundOverHTTP(ch, "rf-http", `{"amount_cents":500}`)
	if h.Status != 201 {
		t.Fatalf("refund over HTTP: %d %s", h.Status, h.Body)
	}
	e.send("rf-http", `{"amount_cents":500}`, "", queue.HeaderRefundOf, ch)
	apitest.Eventually(t, 30*time.Second, "the replays", func() bool {
		got := seen()
		return len(got["rf-a"]) == 2 && len(got["rf-http"]) == 1
	})
	got := seen()
	if r := got["rf-a"][1]; r.Header.Get(queue.HeaderStatus) != "201" || !bytes.Equal(r.Data, a.body) || r.Header.Get(queue.HeaderReplayed) != "true" {
		t.Fatalf("the repeat: %s %s; want the first answer, replayed", r.Header.Get(queue.HeaderStatus), r.Data)
	}
	if r := got["rf-http"][0]; r.Header.Get(queue.HeaderStatus) != "201" || !bytes.Equal(r.Data, h.Body) || r.Header.Get(queue.HeaderReplayed) != "true" {
		t.Fatalf("the queue after HTTP: %s %s; want HTTP's bytes %s, replayed", r.Header.Get(queue.HeaderStatus), r.Data, h.Body)
	}

	// Refused: past what remains (1000 left), an unknown charge. Poison:
	// a negative amount, two charge ids, a malformed id.
	e.send("rf-big", `{"amount_cents":2000}`, "", queue.HeaderRefundOf, ch)
	e.send("rf-nocharge", `{}`, "", queue.HeaderRefundOf, "ch_nope")
	e.send("rf-negative", `{"amount_cents":-5}`, "", queue.HeaderRefundOf, ch)
	e.send("rf-two", `{}`, "", queue.HeaderRefundOf, ch, queue.HeaderRefundOf, ch)
	e.send("rf-badid", `{}`, "", queue.HeaderRefundOf, "ch nope")
	g = e.waitResults(20*time.Second, "rf-big", "rf-nocharge", "rf-negative", "rf-two", "rf-badid")
	for key, want := range map[string]struct{ status, slug string }{
		"rf-big":      {"400", chargeonce.EREFUNDEXCEEDS},
		"rf-nocharge": {"404", chargeonce.ENOTFOUND},
		"rf-negative": {"400", chargeonce.EINVALID},
		"rf-two":      {"400", chargeonce.EINVALID},
		"rf-badid":    {"400", chargeonce.EINVALID},
	} {
		r := g[key][0]
		if r.status() != want.status || !strings.Contains(string(r.body), want.slug) || r.header.Get(queue.HeaderRequestSeq) == "" {
			t.Errorf("%s: %s %s (request seq %q); want %s %s for this message", key, r.status(), r.body, r.header.Get(queue.HeaderRequestSeq), want.status, want.slug)
		}
	}
	if r := g["rf-big"][0]; !strings.Contains(string(r.body), "remaining amount_cents is 1000") {
		t.Errorf("the refusal does not name what remains: %s", r.body)
	}
	dead := messages(t, e.js, queue.DeadSubject(merchant))
	if len(dead) != 3 {
		t.Errorf("%d requests dead-lettered; want the three malformed ones", len(dead))
	}

	// Ten concurrent refunds of the 1000 left: one succeeds.
	var keys []string
	for i := range 10 {
		k := fmt.Sprintf("rf-race-%d", i)
		keys = append(keys, k)
		e.send(k, `{}`, "", queue.HeaderRefundOf, ch)
	}
	g = e.waitResults(30*time.Second, keys...)
	won := 0
	for _, k := range keys {
		switch r := g[k][0]; r.status() {
		case "201":
			won++
		case "400":
			if !strings.Contains(string(r.body), chargeonce.EREFUNDEXCEEDS) {
				t.Errorf("%s: %s", k, r.body)
			}
		default:
			t.Errorf("%s: %s %s", k, r.status(), r.body)
		}
	}
	if won != 1 {
		t.Fatalf("%d of 10 refunds of what remains succeeded; want 1", won)
	}
	if got := e.acq.sim.RefundedCents(ch); got != 2500 {
		t.Fatalf("the acquirer refunded %d of a capture of 2500; want all of it, once", got)
	}
}

// TestQueueRefundSettledThroughOutbox: a refund whose acquirer call fails
// (an outage) is acked pending, and its result is published by the outbox
// once recovery has settled it, exactly once.
func TestQueueRefundSettledThroughOutbox(t *testing.T) {
	t.Parallel()
	e := setup(t)
	seen := countingSub(t, e.nc)
	e.worker(queue.WorkerOptions{})
	ch := e.captured("rfo-charge", 41)

	e.acq.down.Store(true)
	e.send("rfo", `{"amount_cents":700}`, "", queue.HeaderRefundOf, ch)
	consumerDrained(t, e.js, queue.DefaultDurable, 20*time.Second)
	if rec, err := e.store.KeyGet(t.Context(), merchant, "rfo"); err != nil || rec.State != chargeonce.KeyProcessing || rec.Refund == nil {
		t.Fatalf("the refund's record: %+v, %v; want a refund processing", rec.State, err)
	}
	if got := seen(); len(got["rfo"]) != 0 {
		t.Fatalf("a result published before settlement: %v", got)
	}
	p := queue.NewPublisher(e.store, e.js, queue.PublisherOptions{Every: 20 * time.Millisecond})
	p.Start(t.Context())
	t.Cleanup(p.Stop)
	rescuer := recovery.NewRescuer(e.store, e.http.Engine, recovery.RescuerOptions{BackoffBase: 100 * time.Millisecond, BackoffMax: 200 * time.Millisecond})
	e.acq.down.Store(false)
	apitest.Eventually(t, 20*time.Second, "recovery to settle the refund", func() bool {
		if _, err := rescuer.RunOnce(t.Context()); err != nil {
			t.Fatal(err)
		}
		st, err := e.store.KeysStuck(t.Context())
		return err == nil && st.Count == 0
	})
	g := e.waitResults(20*time.Second, "rfo")
	time.Sleep(200 * time.Millisecond) // a late second publish would show now
	rec, err := e.store.KeyGet(t.Context(), merchant, "rfo")
	if err != nil || rec.State != chargeonce.KeyCompleted {
		t.Fatalf("the refund's record: %+v, %v", rec.State, err)
	}
	if r := g["rfo"]; len(r) != 1 || len(seen()["rfo"]) != 1 || r[0].status() != "201" || !bytes.Equal(r[0].body, rec.ResponseBody) {
		t.Fatalf("results %v; want exactly one, the stored 201 %s", r, rec.ResponseBody)
	}
	if got := e.acq.sim.RefundedCents(ch); got != 700 {
		t.Fatalf("the acquirer refunded %d; want 700", got)
	}
}
