package acquirer_test

import (
	"errors"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/acquirer"
)

// TestSimulatorRefunds: refunds are idempotent by reference (50 concurrent
// requests for one reference refund once), follow the capture's fault
// tokens on their first request only, are found by a lookup, and never
// take back more than the capture had.
func TestSimulatorRefunds(t *testing.T) {
	t.Parallel()
	sim := acquirer.NewSimulator(acquirer.Options{})
	t.Cleanup(func() { sim.Close() })
	capture := func(ref, token string) {
		t.Helper()
		for range 2 { // the fault tokens strike the first request only
			if _, err := sim.Capture(t.Context(), chargeonce.CaptureRequest{Reference: ref, OrderID: 1, Merchant: "m", AmountCents: 100, Currency: "BRL", PaymentToken: token}); err == nil {
				return
			}
		}
		t.Fatalf("capture %s never settled", ref)
	}
	call := func(ref, charge string, amount int64) chargeonce.RefundCall {
		return chargeonce.RefundCall{Reference: ref, ChargeReference: charge, Merchant: "m", AmountCents: amount, Currency: "BRL"}
	}
	capture("ch_ok", acquirer.TokenOK)

	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() {
			res, err := sim.Refund(t.Context(), call("re_one", "ch_ok", 60))
			if err != nil || res.Status != chargeonce.RefundSucceeded {
				t.Errorf("refund: %+v, %v", res, err)
			}
		})
	}
	wg.Wait()
	if got := sim.RefundedCents("ch_ok"); got != 60 {
		t.Fatalf("50 requests for one refund reference refunded %d; want 60 once", got)
	}
	res, err := sim.Refund(t.Context(), call("re_two", "ch_ok", 60))
	if err != nil || res.Status != chargeonce.RefundFailed || res.FailureReason != acquirer.RefundFailedExceeds {
		t.Fatalf("a second refund of 60 on 100: %+v, %v; want failed %s", res, err, acquirer.RefundFailedExceeds)
	}
	if lr, err := sim.RefundLookup(t.Context(), chargeonce.LookupRequest{Reference: "re_one"}); err != nil || lr.Status != chargeonce.LookupFound || lr.Refund.Status != chargeonce.RefundSucceeded {
		t.Fatalf("lookup of a refund: %+v, %v", lr, err)
	}
	if lr, err := sim.RefundLookup(t.Context(), chargeonce.LookupRequest{Reference: "re_never"}); err != nil || lr.Status != chargeonce.LookupSafeToSend {
		t.Fatalf("lookup of no refund: %+v, %v", lr, err)
	}

	capture("ch_before", acquirer.TokenFailBefore)
	if _, err := sim.Refund(t.Context(), call("re_before", "ch_before", 10)); !errors.Is(err, acquirer.ErrUnavailable) {
		t.Fatalf("first refund of a tok_fail_before capture: %v; want ErrUnavailable", err)
	}
	if got := sim.RefundedCents("ch_before"); got != 0 {
		t.Fatalf("tok_fail_before refunded %d", got)
	}
	if res, err := sim.Refund(t.Context(), call("re_before", "ch_before", 10)); err != nil || res.Status != chargeonce.RefundSucceeded {
		t.Fatalf("its retry: %+v, %v", res, err)
	}

	capture("ch_after", acquirer.TokenFailAfter)
	if _, err := sim.Refund(t.Context(), call("re_after", "ch_after", 10)); !errors.Is(err, acquirer.ErrUnavailable) {
		t.Fatalf("first refund of a tok_fail_after capture: %v; want ErrUnavailable", err)
	}
	if got := sim.RefundedCents("ch_after"); got != 10 {
		t.Fatalf("tok_fail_after refunded %d; want 10 (the reply is lost, the refund happened)", got)
	}
	if res, err := sim.Refund(t.Context(), call("re_after", "ch_after", 10)); err != nil || res.Status != chargeonce.RefundSucceeded {
		t.Fatalf("its retry: %+v, %v", res, err)
	}
	if got := sim.RefundedCents("ch_after"); got != 10 {
		t.Fatalf("the retry refunded again: %d", got)
	}
	if res, err := sim.Refund(t.Context(), call("re_unknown", "ch_nope", 10)); err != nil || res.Status != chargeonce.RefundFailed || res.FailureReason != acquirer.RefundFailedUnknownCapture {
		t.Fatalf("refund of no capture: %+v, %v", res, err)
	}
	if _, err := sim.Refund(t.Context(), call("", "ch_ok", 10)); !errors.Is(err, chargeonce.ErrCaptureRejected) {
		t.Fatalf("refund without a reference: %v; want a rejection", err)
	}
}

// TestClientRefundsOverHTTP: the HTTP client refunds through the
// simulator's API with the same outcomes and an honest lookup.
func TestClientRefundsOverHTTP(t *testing.T) {
	t.Parallel()
	sim := acquirer.NewSimulator(acquirer.Options{})
	t.Cleanup(func() { sim.Close() })
	srv := httptest.NewServer(acquirer.Handler(sim))
	t.Cleanup(srv.Close)
	c := acquirer.NewClient(srv.URL, nil)
	if _, err := c.Capture(t.Context(), chargeonce.CaptureRequest{Reference: "ch_h", OrderID: 1, Merchant: "m", AmountCents: 100, Currency: "BRL", PaymentToken: acquirer.TokenFailAfter}); err == nil {
		t.Fatal("tok_fail_after's first capture answered")
	}
	if lr, err := c.RefundLookup(t.Context(), chargeonce.LookupRequest{Reference: "re_h"}); err != nil || lr.Status != chargeonce.LookupSafeToSend {
		t.Fatalf("lookup before any refund: %+v, %v; want safe to send", lr, err)
	}
	call := chargeonce.RefundCall{Reference: "re_h", ChargeReference: "ch_h", Merchant: "m", AmountCents: 40, Currency: "BRL"}
	if _, err := c.Refund(t.Context(), call); err == nil || errors.Is(err, chargeonce.ErrCaptureRejected) {
		t.Fatalf("first refund after tok_fail_after: %v; want an unknown outcome", err)
	}
	lr, err := c.RefundLookup(t.Context(), chargeonce.LookupRequest{Reference: "re_h"})
	if err != nil || lr.Status != chargeonce.LookupFound || lr.Refund.Status != chargeonce.RefundSucceeded {
		t.Fatalf("lookup after the lost reply: %+v, %v; want found succeeded", lr, err)
	}
	if res, err := c.Refund(t.Context(), call); err != nil || res.Status != chargeonce.RefundSucceeded {
		t.Fatalf("retry: %+v, %v", res, err)
	}
	if got := sim.RefundedCents("ch_h"); got != 40 {
		t.Fatalf("refunded %d; want 40 once", got)
	}
	call.Reference, call.AmountCents = "re_bad", 0
	if _, err := c.Refund(t.Context(), call); !errors.Is(err, chargeonce.ErrCaptureRejected) {
		t.Fatalf("refund of 0: %v; want a rejection", err)
	}
}
