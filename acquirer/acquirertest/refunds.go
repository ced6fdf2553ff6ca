package acquirertest

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
)

// RunRefunds runs the refund checks on an adapter that refunds
// (chargeonce.Refunder): every adapter that can refund must pass them, and
// one whose Acquirer is no Refunder fails.
func RunRefunds(t *testing.T, newHarness func(t *testing.T) Harness) {
	t.Helper()
	for _, c := range RefundChecks() {
		t.Run(c.Name, func(t *testing.T) {
			t.Parallel()
			c.Run(t, newHarness(t))
		})
	}
}

func refunder(t testing.TB, h Harness) chargeonce.Refunder {
	t.Helper()
	r, ok := h.Acquirer.(chargeonce.Refunder)
	if !ok {
		t.Fatalf("%T does not refund: it is no chargeonce.Refunder", h.Acquirer)
	}
	if h.Refunds == nil || h.Refunded == nil {
		t.Fatal("the harness of an adapter that refunds must set Refunds and Refunded")
	}
	return r
}

// captured captures ref with token, failing t unless it captured (an
// unknown outcome is allowed for the harness's LostAnswer token, which
// captures and loses the answer).
func captured(t testing.TB, h Harness, ref, token string) {
	t.Helper()
	res, err := h.Acquirer.Capture(t.Context(), req(ref, token))
	if token == h.LostAnswer {
		wantUnknown(t, res, err)
		if n := h.Captures(ref); n != 1 {
			t.Fatalf("Capture(%s) with the lost-answer token captured %d times, want 1", ref, n)
		}
		return
	}
	if err != nil || res.Status != chargeonce.StatusCaptured {
		t.Fatalf("Capture(%s) = %+v, %v; want captured", ref, res, err)
	}
}

func refundCall(ref, chargeRef string, cents int64) chargeonce.RefundCall {
	return chargeonce.RefundCall{Reference: ref, ChargeReference: chargeRef, Merchant: "demo", AmountCents: cents, Currency: "BRL"}
}

func wantRefundUnknown(t testing.TB, res chargeonce.RefundResult, err error) {
	t.Helper()
	if err == nil || errors.Is(err, chargeonce.ErrCaptureRejected) {
		t.Fatalf("Refund = %+v, %v; want an unknown outcome (an error that is not ErrCaptureRejected)", res, err)
	}
}

// settleRefund drives call as the engine's recovery does after an unknown
// outcome, until it has a definite answer: look the reference up (its age
// measured from firstSent), take what is found, re-send only when the
// lookup says it is safe, wait while it is unsure. It fails t if the
// refund stays undecided for settleWithin.
func settleRefund(t testing.TB, h Harness, call chargeonce.RefundCall, firstSent time.Time) chargeonce.RefundResult {
	t.Helper()
	r := refunder(t, h)
	for deadline := time.Now().Add(settleWithin); ; {
		lr, err := r.RefundLookup(t.Context(), chargeonce.LookupRequest{Reference: call.Reference, ChargeReference: call.ChargeReference,
			Age: time.Since(firstSent), AgeKnown: true, Purpose: chargeonce.LookupToResend})
		if err != nil {
			t.Fatalf("RefundLookup(%s): %v", call.Reference, err)
		}
		wait := max(lr.RetryAfter, 50*time.Millisecond)
		switch lr.Status {
		case chargeonce.LookupFound:
			if lr.Refund.Reference != call.Reference || !lr.Refund.Status.Final() {
				t.Fatalf("RefundLookup(%s) found %+v; want a settled refund of the reference", call.Reference, lr.Refund)
			}
			return lr.Refund
		case chargeonce.LookupSafeToSend:
			res, err := r.Refund(t.Context(), call)
			if err == nil {
				return res
			}
			if errors.Is(err, chargeonce.ErrCaptureRejected) {
				t.Fatalf("the re-send a safe lookup allowed was refused: %v", err)
			}
			t.Logf("re-send of %s: %v", call.Reference, err)
		default:
			t.Logf("RefundLookup(%s) unsure: %+v", call.Reference, lr)
		}
		if time.Now().After(deadline) {
			t.Fatalf("refund %s still undecided %s after it was first sent: it would stay pending", call.Reference, settleWithin)
		}
		time.Sleep(min(wait, 500*time.Millisecond))
	}
}

// RefundChecks returns the refund checks.
func RefundChecks() []Check {
	return []Check{
		// Ten concurrent sends of one reference move money back once: each
		// answers succeeded or an unknown outcome (an acquirer may answer
		// "in use" to a concurrent request with the key), and driving the
		// reference to its end answers succeeded.
		{"RefundIdempotentByReference", func(t testing.TB, h Harness) {
			r := refunder(t, h)
			captured(t, h, "ch_rf_idem", h.OK)
			call := refundCall("re_rf_idem", "ch_rf_idem", 1000)
			sent := time.Now()
			var wg sync.WaitGroup
			results := make([]chargeonce.RefundResult, 10)
			errs := make([]error, 10)
			for i := range results {
				wg.Go(func() { results[i], errs[i] = r.Refund(t.Context(), call) })
			}
			wg.Wait()
			for i := range results {
				if errs[i] != nil {
					wantRefundUnknown(t, results[i], errs[i])
					continue
				}
				if results[i].Status != chargeonce.RefundSucceeded || results[i].Reference != call.Reference {
					t.Fatalf("Refund %d = %+v; want succeeded", i, results[i])
				}
			}
			if res := settleRefund(t, h, call, sent); res.Status != chargeonce.RefundSucceeded {
				t.Fatalf("the refund settled as %+v; want succeeded", res)
			}
			for i := range 2 {
				if res, err := r.Refund(t.Context(), call); err != nil || res.Status != chargeonce.RefundSucceeded {
					t.Fatalf("re-send %d of a settled refund = %+v, %v; want its first answer, succeeded", i, res, err)
				}
			}
			if n := h.Refunds(call.Reference); n != 1 {
				t.Fatalf("one reference sent 13 times refunded %d times, want 1", n)
			}
			if got := h.Refunded("ch_rf_idem"); got != 1000 {
				t.Fatalf("the charge had %d refunded, want 1000", got)
			}
		}},

		// Refunds of one capture never move back more than it captured:
		// a refund past what remains moves nothing, and of ten concurrent
		// refunds of 600 with 990 left, one at most succeeds.
		{"RefundNeverExceedsCaptured", func(t testing.TB, h Harness) {
			r := refunder(t, h)
			captured(t, h, "ch_rf_cap", h.OK)
			if res, err := r.Refund(t.Context(), refundCall("re_rf_cap_first", "ch_rf_cap", 1000)); err != nil || res.Status != chargeonce.RefundSucceeded {
				t.Fatalf("a refund of 1000 of a 1990 capture = %+v, %v; want succeeded", res, err)
			}
			res, err := r.Refund(t.Context(), refundCall("re_rf_cap_over", "ch_rf_cap", 1990))
			if err == nil && res.Status == chargeonce.RefundSucceeded {
				t.Fatalf("a refund of 1990 after 1000 of a 1990 capture succeeded: %+v", res)
			}
			if n := h.Refunds("re_rf_cap_over"); n != 0 {
				t.Fatalf("the refund past the capture moved money %d times", n)
			}
			var wg sync.WaitGroup
			succeeded := make([]bool, 10)
			for i := range succeeded {
				wg.Go(func() {
					res, err := r.Refund(t.Context(), refundCall(fmt.Sprintf("re_rf_cap_%d", i), "ch_rf_cap", 600))
					succeeded[i] = err == nil && res.Status == chargeonce.RefundSucceeded
				})
			}
			wg.Wait()
			n := 0
			for _, ok := range succeeded {
				if ok {
					n++
				}
			}
			if n > 1 {
				t.Fatalf("%d concurrent refunds of 600 with 990 left succeeded; want at most 1", n)
			}
			if got := h.Refunded("ch_rf_cap"); got > 1990 {
				t.Fatalf("the capture of 1990 had %d refunded", got)
			}
		}},

		{"RefundLookupHonest", func(t testing.TB, h Harness) {
			r := refunder(t, h)
			captured(t, h, "ch_rf_look", h.OK)
			q := chargeonce.LookupRequest{Reference: "re_rf_look", ChargeReference: "ch_rf_look", Purpose: chargeonce.LookupToResolve}
			lr, err := r.RefundLookup(t.Context(), q)
			if err != nil || lr.Status == chargeonce.LookupFound {
				t.Fatalf("RefundLookup of a refund never sent = %+v, %v; want not found", lr, err)
			}
			call := refundCall("re_rf_look", "ch_rf_look", 500)
			if _, err := r.Refund(t.Context(), call); err != nil {
				t.Fatalf("Refund: %v", err)
			}
			lr, err = r.RefundLookup(t.Context(), q)
			if err != nil || lr.Status != chargeonce.LookupFound || lr.Refund.Status != chargeonce.RefundSucceeded || lr.Refund.Reference != call.Reference {
				t.Fatalf("RefundLookup after the refund = %+v, %v; want found, succeeded", lr, err)
			}
		}},

		// The answer of a refund is lost (the charge was captured with the
		// lost-answer token, whose first refund loses its answer too): the
		// outcome is unknown, and recovery's lookup and re-send settle it
		// with money moved back once.
		{"RefundLostAnswerIsUnknownAndLookupTellsTheTruth", func(t testing.TB, h Harness) {
			captured(t, h, "ch_rf_lost", h.LostAnswer)
			call := refundCall("re_rf_lost", "ch_rf_lost", 700)
			sent := time.Now()
			res, err := refunder(t, h).Refund(t.Context(), call)
			wantRefundUnknown(t, res, err)
			if res := settleRefund(t, h, call, sent); res.Status != chargeonce.RefundSucceeded {
				t.Fatalf("the refund settled as %+v; want succeeded", res)
			}
			if n := h.Refunds(call.Reference); n != 1 {
				t.Fatalf("refunded %d times, want 1", n)
			}
		}},

		// As LookupAfterTheKeyIsForgotten for captures: the acquirer has
		// forgotten the refund's key when recovery asks, and the lookup
		// must find the refund rather than call it safe to send.
		{"RefundLookupAfterTheKeyIsForgotten", func(t testing.TB, h Harness) {
			captured(t, h, "ch_rf_forgot", h.OK)
			call := refundCall("re_rf_forgot", "ch_rf_forgot", 300)
			sent := time.Now()
			if res, err := refunder(t, h).Refund(t.Context(), call); err != nil || res.Status != chargeonce.RefundSucceeded {
				t.Fatalf("Refund = %+v, %v; want succeeded", res, err)
			}
			time.Sleep(h.KeyTTL + 100*time.Millisecond)
			if res := settleRefund(t, h, call, sent); res.Status != chargeonce.RefundSucceeded {
				t.Fatalf("the refund settled as %+v; want succeeded", res)
			}
			if n := h.Refunds(call.Reference); n != 1 {
				t.Fatalf("refunded %d times after the key was forgotten, want 1: the lookup let a re-send move money again", n)
			}
		}},

		{"RefundInvalidIsRejected", func(t testing.TB, h Harness) {
			r := refunder(t, h)
			_, err := r.Refund(t.Context(), refundCall("re_rf_bad", "ch_x", 0))
			if !errors.Is(err, chargeonce.ErrCaptureRejected) {
				t.Fatalf("a refund of 0: %v; want ErrCaptureRejected", err)
			}
		}},
	}
}
