// Package acquirertest is the conformance suite every chargeonce.Acquirer
// passes, as the stores share storetest: idempotent by reference, outcome
// classes, and a lookup that never lies. It runs against the simulator, the
// HTTP client in front of it, and the Stripe adapter in front of its fake.
package acquirertest

import (
	"errors"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
)

// Harness is what the suite needs of an adapter under test.
type Harness struct {
	Acquirer chargeonce.Acquirer
	// Payment tokens: one that captures, one that is declined, and one
	// that captures but loses the answer (the outcome is unknown).
	OK, Declined, LostAnswer string
	// Captures returns how many captures moved money for reference.
	Captures func(reference string) int
}

// Run runs the suite; newHarness returns a fresh adapter for each test.
func Run(t *testing.T, newHarness func(t *testing.T) Harness) {
	t.Helper()
	req := func(ref, token string) chargeonce.CaptureRequest {
		return chargeonce.CaptureRequest{Reference: ref, OrderID: 1, Merchant: "demo", AmountCents: 1990, Currency: "BRL", PaymentToken: token}
	}
	lookup := func(t *testing.T, h Harness, ref string) chargeonce.LookupResult {
		t.Helper()
		lr, err := h.Acquirer.Lookup(t.Context(), chargeonce.LookupRequest{Reference: ref, FirstSent: time.Now().Add(-time.Second)})
		if err != nil {
			t.Fatalf("Lookup(%s): %v", ref, err)
		}
		return lr
	}

	t.Run("IdempotentByReference", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t)
		for i := range 3 {
			res, err := h.Acquirer.Capture(t.Context(), req("ch_idem", h.OK))
			if err != nil || res.Status != chargeonce.StatusCaptured || res.Reference != "ch_idem" {
				t.Fatalf("capture %d: %+v, %v; want captured", i, res, err)
			}
		}
		if n := h.Captures("ch_idem"); n != 1 {
			t.Fatalf("three sends of one reference captured %d times, want 1", n)
		}
	})

	t.Run("DeclinedWithACode", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t)
		res, err := h.Acquirer.Capture(t.Context(), req("ch_dec", h.Declined))
		if err != nil || res.Status != chargeonce.StatusDeclined || res.DeclineCode == "" {
			t.Fatalf("Capture = %+v, %v; want declined with a code", res, err)
		}
		if n := h.Captures("ch_dec"); n != 0 {
			t.Fatalf("a decline captured %d times", n)
		}
	})

	t.Run("LostAnswerIsUnknownAndLookupTellsTheTruth", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t)
		res, err := h.Acquirer.Capture(t.Context(), req("ch_lost", h.LostAnswer))
		if err == nil || errors.Is(err, chargeonce.ErrCaptureRejected) {
			t.Fatalf("Capture = %+v, %v; want an unknown outcome", res, err)
		}
		switch lr := lookup(t, h, "ch_lost"); lr.Status {
		case chargeonce.LookupFound:
			if lr.Result.Status != chargeonce.StatusCaptured {
				t.Fatalf("Lookup = %+v; want the capture", lr)
			}
		case chargeonce.LookupSafeToSend:
			// Safe means a re-send returns the capture, not a second one.
			res, err := h.Acquirer.Capture(t.Context(), req("ch_lost", h.LostAnswer))
			if err != nil || res.Status != chargeonce.StatusCaptured {
				t.Fatalf("the re-send a safe lookup allowed: %+v, %v; want the capture", res, err)
			}
		default:
			t.Logf("Lookup unsure: %+v", lr)
		}
		if n := h.Captures("ch_lost"); n != 1 {
			t.Fatalf("captured %d times, want 1", n)
		}
	})

	t.Run("LookupNeverFindsWhatWasNeverSent", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t)
		if lr := lookup(t, h, "ch_never"); lr.Status == chargeonce.LookupFound {
			t.Fatalf("Lookup of a reference never sent = %+v", lr)
		}
	})

	t.Run("LookupOfASettledCapture", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t)
		if _, err := h.Acquirer.Capture(t.Context(), req("ch_set", h.OK)); err != nil {
			t.Fatal(err)
		}
		lr := lookup(t, h, "ch_set")
		switch lr.Status {
		case chargeonce.LookupFound:
			if lr.Result.Status != chargeonce.StatusCaptured {
				t.Fatalf("Lookup = %+v; want captured", lr)
			}
		case chargeonce.LookupSafeToSend:
			if res, err := h.Acquirer.Capture(t.Context(), req("ch_set", h.OK)); err != nil || res.Status != chargeonce.StatusCaptured {
				t.Fatalf("re-send: %+v, %v", res, err)
			}
		default:
			t.Fatalf("Lookup of a settled capture = %+v; want found or safe to send", lr)
		}
		if n := h.Captures("ch_set"); n != 1 {
			t.Fatalf("captured %d times, want 1", n)
		}
	})
}
