package stripe_test

import (
	"errors"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/acquirer/stripe"
	"github.com/chargeonce/chargeonce/acquirer/stripetest"
)

func refundCall(ref, chargeRef string, cents int64) chargeonce.RefundCall {
	return chargeonce.RefundCall{Reference: ref, ChargeReference: chargeRef, Merchant: "demo", AmountCents: cents, Currency: "BRL"}
}

// TestRefundOutcomes: a refund is a Refund of the charge's PaymentIntent,
// with the refund's reference as its Idempotency-Key and in its metadata;
// more than remains is refused (nothing moves), a repeat replays.
func TestRefundOutcomes(t *testing.T) {
	t.Parallel()
	e := setup(t, stripetest.Options{}, stripe.Options{}, 0)
	ctx := t.Context()
	if _, err := e.acq.Capture(ctx, capture("ch_rf", stripetest.PMOK)); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		res, err := e.acq.Refund(ctx, refundCall("re_1", "ch_rf", 1500))
		if want := (chargeonce.RefundResult{Reference: "re_1", Status: chargeonce.RefundSucceeded}); err != nil || res != want {
			t.Fatalf("send %d: Refund = %+v, %v; want %+v", i, res, err, want)
		}
	}
	if _, err := e.acq.Refund(ctx, refundCall("re_2", "ch_rf", 491)); !errors.Is(err, chargeonce.ErrCaptureRejected) {
		t.Fatalf("a refund of 491 with 490 left: %v; want a rejection", err)
	}
	if _, err := e.acq.Refund(ctx, refundCall("re_1", "ch_rf", 400)); err == nil || errors.Is(err, chargeonce.ErrCaptureRejected) {
		t.Fatalf("a changed request under a used key (idempotency_error): %v; want an unknown outcome", err)
	}
	if got := e.fake.RefundedCents("ch_rf"); got != 1500 {
		t.Fatalf("refunded %d, want 1500", got)
	}
	pi := e.fake.Intents()[0].ID
	var found bool
	for _, r := range e.fake.Requests() {
		if r.Path != "/v1/refunds" || r.Method != "POST" || r.IdempotencyKey != "re_1" || found {
			continue
		}
		found = true
		for k, want := range map[string]string{
			"payment_intent": pi, "amount": "1500", "metadata[chargeonce_refund_reference]": "re_1",
			"metadata[chargeonce_reference]": "ch_rf", "metadata[merchant]": "demo",
		} {
			if got := r.Form.Get(k); got != want {
				t.Errorf("%s = %q, want %q", k, got, want)
			}
		}
	}
	if !found {
		t.Fatal("no refund request with Idempotency-Key re_1")
	}
	// A charge captured by another instance is found by Search.
	other, err := stripe.New(stripe.Options{Key: testKey, APIBase: e.url})
	if err != nil {
		t.Fatal(err)
	}
	if res, err := other.Refund(ctx, refundCall("re_4", "ch_rf", 490)); err != nil || res.Status != chargeonce.RefundSucceeded {
		t.Fatalf("a refund through Search = %+v, %v; want succeeded", res, err)
	}
}

// TestRefundPendingIsOpen: a pending Refund is an unknown outcome naming
// it; its lookup retrieves it, unsure and binding while pending, found
// once it settled.
func TestRefundPendingIsOpen(t *testing.T) {
	t.Parallel()
	const processing = time.Second
	e := setup(t, stripetest.Options{Processing: processing}, stripe.Options{}, 0)
	ctx := t.Context()
	if _, err := e.acq.Capture(ctx, capture("ch_pend", stripetest.PMRefundPending)); err != nil {
		t.Fatal(err)
	}
	_, err := e.acq.Refund(ctx, refundCall("re_pend", "ch_pend", 100))
	open, ok := errors.AsType[chargeonce.AcquirerIDError](err)
	if !ok || open.AcquirerID() == "" || errors.Is(err, chargeonce.ErrCaptureRejected) {
		t.Fatalf("a pending Refund: %v; want an unknown outcome naming it", err)
	}
	q := chargeonce.LookupRequest{Reference: "re_pend", ChargeReference: "ch_pend", AcquirerID: open.AcquirerID(), Purpose: chargeonce.LookupToResolve}
	if lr, err := e.acq.RefundLookup(ctx, q); err != nil || lr.Status != chargeonce.LookupUnsure || !lr.Open() {
		t.Fatalf("RefundLookup of the pending Refund = %+v, %v; want unsure, open", lr, err)
	}
	time.Sleep(processing)
	if lr, err := e.acq.RefundLookup(ctx, q); err != nil || lr.Status != chargeonce.LookupFound || lr.Refund.Status != chargeonce.RefundSucceeded {
		t.Fatalf("RefundLookup once settled = %+v, %v; want found, succeeded", lr, err)
	}
	q.AcquirerID = ""
	if lr, err := e.acq.RefundLookup(ctx, q); err != nil || lr.Status != chargeonce.LookupFound {
		t.Fatalf("RefundLookup by the list = %+v, %v; want found", lr, err)
	}
}

// TestRefundWaitsForSearch: a refund of a charge whose PaymentIntent
// Search does not show yet sends nothing (an unknown outcome), and its
// lookup is unsure until the lag is over: then a miss is safe to send.
func TestRefundWaitsForSearch(t *testing.T) {
	t.Parallel()
	e := setup(t, stripetest.Options{SearchLag: time.Hour}, stripe.Options{KeyWindow: time.Minute, SearchLag: 10 * time.Minute}, 0)
	ctx := t.Context()
	other, err := stripe.New(stripe.Options{Key: testKey, APIBase: e.url, KeyWindow: time.Minute, SearchLag: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.Capture(ctx, capture("ch_lag", stripetest.PMOK)); err != nil {
		t.Fatal(err)
	}
	res, err := e.acq.Refund(ctx, refundCall("re_lag", "ch_lag", 100))
	if err == nil || errors.Is(err, chargeonce.ErrCaptureRejected) {
		t.Fatalf("Refund before Search shows the PaymentIntent = %+v, %v; want an unknown outcome", res, err)
	}
	if n := len(e.fake.Refunds()); n != 0 {
		t.Fatalf("%d Refunds created; want none", n)
	}
	q := chargeonce.LookupRequest{Reference: "re_lag", ChargeReference: "ch_lag", Age: 5 * time.Minute, AgeKnown: true}
	if lr, err := e.acq.RefundLookup(ctx, q); err != nil || lr.Status != chargeonce.LookupUnsure || lr.RetryAfter != 5*time.Minute {
		t.Fatalf("RefundLookup within the lag = %+v, %v; want unsure for 5m", lr, err)
	}
	q.Age = 11 * time.Minute
	if lr, err := e.acq.RefundLookup(ctx, q); err != nil || lr.Status != chargeonce.LookupSafeToSend {
		t.Fatalf("RefundLookup past the lag = %+v, %v; want safe to send", lr, err)
	}
	q.Age = 30 * time.Second
	if lr, err := e.acq.RefundLookup(ctx, q); err != nil || lr.Status != chargeonce.LookupSafeToSend {
		t.Fatalf("RefundLookup within the key window = %+v, %v; want safe to send", lr, err)
	}
}
