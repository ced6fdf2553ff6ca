package httpapi_test

import (
	"bytes"
	"testing"

	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/internal/apitest"
)

// TestEveryKindsRetryOverTheRateGetsItsStoredAnswer (issue 47.7): a
// retry over the merchant's rate is answered from its stored record for
// every kind, as a charge's is (TestMerchantRateCheapAnswersFirst): a
// refund's, a capture's and a cancel's retry reaching another instance,
// whose replay cache has never seen the key, once got 429 "nothing was
// kept for this Idempotency-Key", and a client that believes it may
// refund again under a new key. Only new work is refused.
func TestEveryKindsRetryOverTheRateGetsItsStoredAnswer(t *testing.T) {
	t.Parallel()
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			f := setup(t, kind, engine.Options{}, acquirer.Options{})
			// Another instance over the same store and acquirer: one
			// token, then one an hour.
			other := apitest.Start(t, f.store, f.sim, engine.Options{MerchantRate: engine.Rate{PerSecond: 1.0 / 3600, Burst: 1}})
			c := capture(t, f, 5000, "tok_ok")
			toCapture := authorize(t, f.inst.URL, 5000, "tok_ok")
			toCancel := authorize(t, f.inst.URL, 5000, "tok_ok")
			type attempt struct {
				what, chargeID, verb, key, body string
				status                          int
			}
			attempts := []attempt{
				{"refund", c.ID, "refunds", "rate-refund", `{"amount_cents": 1200}`, 201},
				{"capture", toCapture.ID, "capture", "rate-capture", `{"amount_cents": 3000}`, 200},
				{"cancel", toCancel.ID, "cancel", "rate-cancel", ``, 200},
			}
			first := map[string]apitest.Result{}
			for _, a := range attempts {
				r := operate(t, f.inst.URL, a.chargeID, a.verb, a.key, a.body)
				if r.Status != a.status {
					t.Fatalf("the %s: %d %s; want %d", a.what, r.Status, r.Body, a.status)
				}
				first[a.what] = r
			}
			// The other instance's one token goes to a new charge.
			if r := apitest.Charge(t, other.URL, "rate-spend", chargeBody(orderSeq.Add(1), "tok_ok")); r.Status != 201 {
				t.Fatalf("the other instance's first charge: %d %s", r.Status, r.Body)
			}
			wantProblem(t, apitest.Charge(t, other.URL, "rate-new", chargeBody(orderSeq.Add(1), "tok_ok")), 429, "rate-limited")
			before := f.sim.Stats()
			for _, a := range attempts {
				for i := range 2 {
					r := operate(t, other.URL, a.chargeID, a.verb, a.key, a.body)
					if r.Status != a.status || r.Header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(r.Body, first[a.what].Body) {
						t.Errorf("the %s's retry %d on another instance, over the rate: %d %s; want its stored %d, replayed", a.what, i, r.Status, r.Body, a.status)
					}
				}
				if t.Failed() {
					continue
				}
				// The same key for another request is 422, over the rate too.
				body := `{"amount_cents": 7}`
				if a.verb == "cancel" {
					continue // a cancel has no body to differ
				}
				wantProblem(t, operate(t, other.URL, a.chargeID, a.verb, a.key, body), 422, "idempotency-key-reused")
			}
			if t.Failed() {
				return
			}
			// New work of every kind is still refused, with nothing kept.
			for _, a := range attempts {
				wantProblem(t, operate(t, other.URL, a.chargeID, a.verb, a.key+"-new", a.body), 429, "rate-limited")
			}
			if after := f.sim.Stats(); after.RefundRequests != before.RefundRequests || after.OperationRequests != before.OperationRequests {
				t.Fatalf("retries over the rate reached the acquirer: %+v, then %+v", before, after)
			}
		})
	}
}
