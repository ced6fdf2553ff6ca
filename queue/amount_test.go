package queue_test

import (
	"errors"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/queue"
)

// TestQueueOperationAmountMustBePositive (issue 47.9): a refund's or a
// capture's message reads its amount as the HTTP API does: zero and
// negatives are poison naming amount_cents (zero once meant "all of it"),
// an amount left out (or no body) means all of it.
func TestQueueOperationAmountMustBePositive(t *testing.T) {
	t.Parallel()
	for _, header := range []string{queue.HeaderRefundOf, queue.HeaderCaptureOf} {
		h := nats.Header{header: []string{"ch_x"}}
		for _, body := range []string{`{"amount_cents":0}`, `{"amount_cents":-0}`, `{"amount_cents":-3}`, `{"amount_cents":null}`} {
			_, err := queue.DecodeRequest(h, []byte(body))
			var e *chargeonce.Error
			if chargeonce.ErrorCode(err) != chargeonce.EINVALID || !errors.As(err, &e) || e.Field != "amount_cents" {
				t.Fatalf("%s %s: %v; want EINVALID naming amount_cents", header, body, err)
			}
		}
		for _, body := range []string{``, `{}`, ` `} {
			r, err := queue.DecodeRequest(h, []byte(body))
			if err != nil || r.Refund.AmountCents != 0 || r.Capture.AmountCents != 0 {
				t.Fatalf("%s %q: %+v %v; want all of it (amount 0 in the request)", header, body, r, err)
			}
		}
		r, err := queue.DecodeRequest(h, []byte(`{"amount_cents":7}`))
		if err != nil || r.Refund.AmountCents+r.Capture.AmountCents != 7 {
			t.Fatalf("%s amount 7: %+v %v", header, r, err)
		}
	}
}
