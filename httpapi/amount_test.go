package httpapi_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/engine"
)

// TestOperationAmountMustBePositive (issue 47.9): a refund's or a capture's
// amount_cents, when given, is a positive integer. {"amount_cents": 0} once
// refunded the whole charge (201) and captured the whole authorization, as
// if the amount had been left out; zero and negatives are 400 naming the
// field, nothing kept, nothing sent to the acquirer, and an amount left out
// still means all of it.
func TestOperationAmountMustBePositive(t *testing.T) {
	t.Parallel()
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			f := setup(t, kind, engine.Options{}, acquirer.Options{})
			c := capture(t, f, 5000, "tok_ok")
			a := authorize(t, f.inst.URL, 5000, "tok_ok")
			for i, body := range []string{`{"amount_cents": 0}`, `{"amount_cents": -0}`, `{"amount_cents": -1}`, `{"amount_cents": null}`, `{"amount_cents": 0, "reason": "duplicate"}`} {
				p := wantProblem(t, refund(t, f, c.ID, fmt.Sprintf("zero-refund-%d", i), body), 400, "validation-failed")
				if p.Field != "amount_cents" {
					t.Fatalf("refund %s: the problem names field %q, want amount_cents: %+v", body, p.Field, p)
				}
				if strings.Contains(body, "reason") {
					continue // a capture has no reason
				}
				p = wantProblem(t, operate(t, f.inst.URL, a.ID, "capture", fmt.Sprintf("zero-capture-%d", i), body), 400, "validation-failed")
				if p.Field != "amount_cents" {
					t.Fatalf("capture %s: the problem names field %q, want amount_cents: %+v", body, p.Field, p)
				}
			}
			if st := f.sim.Stats(); st.RefundRequests != 0 || st.OperationRequests != 0 {
				t.Fatalf("a refused amount reached the acquirer: %+v", st)
			}
			// Left out, the amount is all of it.
			if r := operate(t, f.inst.URL, a.ID, "capture", "all-capture", `{}`); r.Status != 200 || decodeCharge(t, r.Body).Status != "captured" {
				t.Fatalf("a capture with the amount left out: %d %s; want 200 captured", r.Status, r.Body)
			}
			if r := refund(t, f, c.ID, "all-refund", ""); r.Status != 201 {
				t.Fatalf("a refund with no body: %d %s; want 201 for the whole charge", r.Status, r.Body)
			}
		})
	}
}
