package client_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/client"
	"github.com/chargeonce/chargeonce/engine"
)

// TestRefundRetriedUntilFinal: a refund whose first answer is lost at the
// acquirer (the charge paid with tok_fail_after) is answered 202 pending;
// the client retries with the same key and body until the 201, and the
// acquirer refunds once. A refund past what remains is a final
// *ValidationError naming the remaining amount, not retried.
func TestRefundRetriedUntilFinal(t *testing.T) {
	t.Parallel()
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			f := setup(t, kind, engine.Options{BackoffBase: 20 * time.Millisecond, BackoffMax: 50 * time.Millisecond}, acquirer.Options{})
			var log attemptLog
			c := newClient(t, f.inst.URL, log.hook())
			ch, err := c.CreateCharge(context.Background(), charge(orderSeq.Add(1), acquirer.TokenFailAfter))
			if err != nil {
				t.Fatalf("CreateCharge: %v", err)
			}
			key := client.NewIdempotencyKey()
			rf, err := c.Refund(context.Background(), client.RefundRequest{ChargeID: ch.ID, AmountCents: 10000, Reason: "requested_by_customer", IdempotencyKey: key})
			if err != nil {
				t.Fatalf("Refund: %v", err)
			}
			if rf.Status != client.RefundSucceeded || rf.AmountCents != 10000 || rf.ChargeID != ch.ID || rf.Attempts < 2 || rf.Reason != "requested_by_customer" {
				t.Fatalf("refund %+v; want succeeded 10000 after a 202", rf)
			}
			atts, _ := log.attempts()
			var refundAtts []client.Attempt
			for _, a := range atts {
				if strings.HasSuffix(a.Path, "/refunds") {
					refundAtts = append(refundAtts, a)
					if a.Key != key {
						t.Fatalf("attempt %+v with another key than %s", a, key)
					}
				}
			}
			if len(refundAtts) < 2 || refundAtts[0].Status != 202 || refundAtts[len(refundAtts)-1].Status != 201 {
				t.Fatalf("refund attempts %+v; want 202 first and 201 last", refundAtts)
			}
			if st := f.sim.Stats(); st.RefundRequests != 1 || st.Refunds != 1 {
				t.Fatalf("acquirer %+v; want one refund request", st)
			}
			got, err := c.GetRefund(context.Background(), rf.ID)
			if err != nil || got.Status != client.RefundSucceeded || got.FailureReason != "" {
				t.Fatalf("GetRefund: %+v, %v", got, err)
			}

			_, err = c.Refund(context.Background(), client.RefundRequest{ChargeID: ch.ID, AmountCents: 20000})
			var ve *client.ValidationError
			if !errors.As(err, &ve) || !strings.Contains(err.Error(), "remaining amount_cents is 15000") || client.Attempts(err) != 1 {
				t.Fatalf("refund past the rest: %v (attempts %d); want one final ValidationError naming 15000", err, client.Attempts(err))
			}
			rest, err := c.Refund(context.Background(), client.RefundRequest{ChargeID: ch.ID})
			if err != nil || rest.AmountCents != 15000 || rest.Status != client.RefundSucceeded {
				t.Fatalf("refund of the rest: %+v, %v", rest, err)
			}
		})
	}
}
