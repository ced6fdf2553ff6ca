package queue_test

import (
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/idempotency"
	"github.com/chargeonce/chargeonce/internal/apitest"
	"github.com/chargeonce/chargeonce/queue"
	"github.com/chargeonce/chargeonce/wire"
)

// TestMaxDeliverInFlightHandedToOutbox: an attempt elsewhere holds the key
// for longer than the request's deliveries last. At its last delivery the
// worker stops waiting, flags the record and acks; when the attempt
// completes, the outbox publishes its answer.
func TestMaxDeliverInFlightHandedToOutbox(t *testing.T) {
	t.Parallel()
	e := setup(t)
	seen := countingSub(t, e.nc)
	req, err := wire.DecodeChargeRequest([]byte(body(41, "tok_ok")))
	if err != nil {
		t.Fatal(err)
	}
	// The attempt in flight elsewhere: its record, under a long lease.
	rec, inserted, err := e.store.KeyInsert(t.Context(), chargeonce.KeyInsertParams{
		Fingerprint: idempotency.Fingerprint("POST", "/v1/charges", &req),
		Token:       "tok_elsewhere", Lease: time.Hour,
		Charge: chargeonce.Charge{ID: idempotency.NewChargeID(), MerchantID: merchant, IdempotencyKey: "held",
			OrderID: req.OrderID, AmountCents: req.AmountCents, Currency: req.Currency, PaymentToken: req.PaymentToken},
	})
	if err != nil || !inserted {
		t.Fatalf("KeyInsert: %v, %v", inserted, err)
	}
	e.worker(queue.WorkerOptions{MaxDeliver: 2})
	e.send("held", body(41, "tok_ok"), "")
	consumerDrained(t, e.js, queue.DefaultDurable, 20*time.Second)
	if got := seen(); len(got) != 0 {
		t.Fatalf("published before the attempt finished: %v", got)
	}
	var flagged bool
	if err := e.store.Pool().QueryRow(t.Context(), `SELECT notify FROM idempotency_keys WHERE merchant_id = $1 AND key = 'held'`, merchant).Scan(&flagged); err != nil || !flagged {
		t.Fatalf("the worker did not flag the record: notify=%v, %v", flagged, err)
	}

	final := rec.Charge
	final.Status = chargeonce.StatusCaptured
	resp := engine.FinalResponse(&final)
	if err := e.store.KeyComplete(t.Context(), chargeonce.KeyCompleteParams{
		MerchantID: merchant, Key: "held", Token: "tok_elsewhere",
		ChargeStatus: chargeonce.StatusCaptured, ResponseStatus: resp.Status, ResponseBody: resp.Body,
	}); err != nil {
		t.Fatal(err)
	}
	if st, err := e.store.OutboxStats(t.Context()); err != nil || st.Count != 1 {
		t.Fatalf("outbox after the completion: %+v, %v; want 1 (the worker flagged the record)", st, err)
	}
	p := queue.NewPublisher(e.store, e.js, queue.PublisherOptions{})
	if n, err := p.RunOnce(t.Context()); err != nil || n != 1 {
		t.Fatalf("publisher: %d, %v", n, err)
	}
	got := seen()["held"]
	if len(got) != 1 || got[0].Header.Get(queue.HeaderStatus) != "201" || string(got[0].Data) != string(resp.Body) {
		t.Fatalf("results: %v", got)
	}
}

// TestMaxDeliverFailingDeadLettered: a request whose every delivery fails
// (the database is down) is copied to charges.dead with reason
// max-deliveries at its last delivery and terminated, with a 503 result
// saying it was given up; nothing was charged.
func TestMaxDeliverFailingDeadLettered(t *testing.T) {
	t.Parallel()
	e := setup(t)
	eng := engine.New(failingStore{Store: e.store}, e.acq.client(), e.opts)
	w := queue.NewWorker(e.js, eng, e.store, queue.WorkerOptions{MaxDeliver: 2})
	if err := w.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	e.send("doomed", body(51, "tok_ok"), "")
	var dead []stored
	apitest.Eventually(t, 20*time.Second, "the dead letter", func() bool {
		dead = messages(t, e.js, queue.DeadSubject(merchant))
		return len(dead) == 1
	})
	if d := dead[0]; d.header.Get(queue.HeaderDeadReason) != "max-deliveries" || d.key() != "doomed" || string(d.body) != body(51, "tok_ok") {
		t.Fatalf("dead letter: %v %q", d.header, d.body)
	}
	consumerDrained(t, e.js, queue.DefaultDurable, 20*time.Second)
	// Nothing was kept for the key: the result says the request was given
	// up, so that its sender knows to send it again.
	if r := messages(t, e.js, queue.ResultSubject(merchant)); len(r) != 1 || r[0].status() != "503" || r[0].key() != "doomed" {
		t.Fatalf("results %v; want one 503 saying the request was given up", r)
	}
	if st := e.acq.sim.Stats(); st.CaptureRequests != 0 {
		t.Fatalf("the acquirer saw %d requests", st.CaptureRequests)
	}
}
