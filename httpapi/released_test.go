package httpapi_test

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/idempotency"
	"github.com/chargeonce/chargeonce/internal/apitest"
)

// releasingStore releases the processing record of the key a retry is about
// to claim, once, just before the claim: the attempt that owned it let it
// go (an insert whose outcome it could not tell, an attempt refused an
// acquirer slot) between the retry's insert finding it and its claim.
type releasingStore struct {
	chargeonce.Store
	released atomic.Int32
}

func (s *releasingStore) KeyClaim(ctx context.Context, merchantID, key, newToken string, lease time.Duration) (chargeonce.KeyRecord, bool, error) {
	if rec, err := s.KeyGet(ctx, merchantID, key); err == nil && rec.State == chargeonce.KeyProcessing && s.released.Add(1) == 1 {
		if err := s.KeyRelease(ctx, merchantID, key, rec.Token); err != nil {
			return chargeonce.KeyRecord{}, false, err
		}
	}
	return s.Store.KeyClaim(ctx, merchantID, key, newToken, lease)
}

// A retry that finds its key's record with the lease ended, and sees it
// released before it can claim it, starts again with an insert: the chaos
// suite's HA run saw POST /v1/charges answered 404 "idempotency key not
// found" (a status SPEC never gives a charge) when the claim found no
// record. The retry here is answered 201 and the acquirer captures once.
func TestRetryFindingItsRecordReleasedChargesOnce(t *testing.T) {
	t.Parallel()
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			store := &releasingStore{Store: apitest.Store(t, kind)}
			sim := apitest.Simulator(t, acquirer.Options{})
			inst := apitest.Start(t, store, sim, engine.Options{})
			order := orderSeq.Add(1)
			body := chargeBody(order, "tok_ok")
			key := "released-" + kind
			var req chargeonce.ChargeRequest
			if err := json.Unmarshal([]byte(body), &req); err != nil {
				t.Fatal(err)
			}
			if err := req.Normalize(); err != nil {
				t.Fatal(err)
			}
			// The record of an attempt that had not reached the acquirer
			// yet, its lease already over.
			if _, inserted, err := store.KeyInsert(t.Context(), chargeonce.KeyInsertParams{
				Fingerprint: idempotency.Fingerprint("POST", "/v1/charges", &req),
				Token:       "tok_first_attempt",
				Lease:       time.Millisecond,
				Charge: chargeonce.Charge{ID: idempotency.NewChargeID(), MerchantID: "demo", IdempotencyKey: key,
					OrderID: req.OrderID, AmountCents: req.AmountCents, Currency: req.Currency, PaymentToken: req.PaymentToken},
			}); err != nil || !inserted {
				t.Fatalf("KeyInsert = %v, %v", inserted, err)
			}
			time.Sleep(20 * time.Millisecond)

			r := apitest.Charge(t, inst.URL, key, body)
			if store.released.Load() == 0 {
				t.Fatal("the retry never claimed the record: the interleaving under test did not happen")
			}
			if r.Status != 201 {
				t.Fatalf("the retry: %d %s; want 201", r.Status, r.Body)
			}
			sim.Wait()
			if n := sim.CapturedCount("demo", order); n != 1 {
				t.Fatalf("acquirer captured order %d %d times, want 1", order, n)
			}
			if again := apitest.Charge(t, inst.URL, key, body); again.Status != 201 || string(again.Body) != string(r.Body) || again.Header.Get("Idempotent-Replayed") != "true" {
				t.Fatalf("the next retry: %d %s (replayed %q); want the stored 201", again.Status, again.Body, again.Header.Get("Idempotent-Replayed"))
			}
		})
	}
}
