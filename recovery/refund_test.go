package recovery_test

import (
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/idempotency"
	"github.com/chargeonce/chargeonce/recovery"
)

// TestRecoverySettlesOrphanRefunds: refunds whose attempt died after
// committing the record, one before the acquirer heard of it and one after
// it refunded, are claimed by the same recovery pass as charges, looked up
// first, and settled: the first is sent once, the second never again.
func TestRecoverySettlesOrphanRefunds(t *testing.T) {
	t.Parallel()
	e := setup(t, nil, engine.Options{})
	eng := engine.New(e.store, e.sim, e.eng.Options())
	req := request("tok_ok")
	if resp, err := eng.Charge(t.Context(), "demo", "charge", req); err != nil || resp.Status != 201 {
		t.Fatalf("charge: %d %s, %v", resp.Status, resp.Body, err)
	}
	ch := get(t, e.store, "charge").Charge

	orphan := func(key string, amount int64) chargeonce.KeyRecord {
		t.Helper()
		rr := chargeonce.RefundRequest{AmountCents: amount}
		rec, inserted, err := e.store.RefundInsert(t.Context(), chargeonce.RefundInsertParams{
			Fingerprint: idempotency.RefundFingerprint(ch.ID, &rr),
			Token:       idempotency.NewToken(),
			Lease:       time.Millisecond, // the attempt died: its lease is over at once
			Refund: chargeonce.Refund{
				ID: idempotency.NewRefundID(), MerchantID: "demo", IdempotencyKey: key, ChargeID: ch.ID, AmountCents: amount,
			},
		})
		if err != nil || !inserted {
			t.Fatalf("RefundInsert(%s): inserted=%v, %v", key, inserted, err)
		}
		return rec
	}
	never := orphan("never-sent", 1000)
	sent := orphan("sent", 500)
	if res, err := e.sim.Refund(t.Context(), chargeonce.RefundCall{
		Reference: sent.Refund.ID, ChargeReference: ch.ID, Merchant: "demo", AmountCents: 500, Currency: ch.Currency,
	}); err != nil || res.Status != chargeonce.RefundSucceeded {
		t.Fatalf("the dead attempt's refund: %+v, %v", res, err)
	}
	time.Sleep(10 * time.Millisecond)

	res, err := recovery.NewRescuer(e.store, eng, recovery.RescuerOptions{}).RunOnce(t.Context())
	if err != nil || res.Claimed != 2 || res.Settled != 2 {
		t.Fatalf("RunOnce = %+v, %v; want both refunds claimed and settled", res, err)
	}
	for _, rec := range []chargeonce.KeyRecord{never, sent} {
		got := get(t, e.store, rec.Key)
		if got.State != chargeonce.KeyCompleted || got.Refund == nil || got.Refund.Status != chargeonce.RefundSucceeded || got.ResponseStatus != 201 {
			t.Fatalf("%s after recovery: state %s, refund %+v, %d", rec.Key, got.State, got.Refund, got.ResponseStatus)
		}
		rf, err := e.store.RefundGet(t.Context(), "demo", rec.Refund.ID)
		if err != nil || rf.Status != chargeonce.RefundSucceeded {
			t.Fatalf("refund %s: %+v, %v", rec.Refund.ID, rf, err)
		}
	}
	if st := e.sim.Stats(); st.RefundRequests != 2 || st.Refunds != 2 || st.DuplicateRefundRequests != 0 {
		t.Fatalf("acquirer stats %+v; want 2 refund requests (the dead attempt's and recovery's of the other), 2 refunds, no duplicate", st)
	}
	if got := e.sim.RefundedCents(ch.ID); got != 1500 {
		t.Fatalf("acquirer refunded %d; want 1500", got)
	}
	// A retry of the refund replays what recovery stored.
	rr := chargeonce.RefundRequest{AmountCents: 1000}
	resp, err := eng.Refund(t.Context(), "demo", ch.ID, "never-sent", &rr)
	if err != nil || !resp.Replayed || resp.Status != 201 {
		t.Fatalf("retry after recovery: %d %s replayed=%v, %v", resp.Status, resp.Body, resp.Replayed, err)
	}
}
