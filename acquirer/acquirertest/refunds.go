package acquirertest

import (
	"errors"
	"sync"
	"testing"

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
	return r
}

// captured captures ref with the harness's OK token, failing t otherwise.
func captured(t testing.TB, h Harness, ref string) {
	t.Helper()
	if res, err := h.Acquirer.Capture(t.Context(), req(ref, h.OK)); err != nil || res.Status != chargeonce.StatusCaptured {
		t.Fatalf("Capture(%s) = %+v, %v; want captured", ref, res, err)
	}
}

// RefundChecks returns the refund checks.
func RefundChecks() []Check {
	return []Check{
		{"RefundIdempotentByReference", func(t testing.TB, h Harness) {
			r := refunder(t, h)
			captured(t, h, "ch_rf_idem")
			call := chargeonce.RefundCall{Reference: "re_rf_idem", ChargeReference: "ch_rf_idem", Merchant: "demo", AmountCents: 1000, Currency: "BRL"}
			var wg sync.WaitGroup
			results := make([]chargeonce.RefundResult, 10)
			errs := make([]error, 10)
			for i := range results {
				wg.Go(func() { results[i], errs[i] = r.Refund(t.Context(), call) })
			}
			wg.Wait()
			for i := range results {
				if errs[i] != nil || results[i].Status != chargeonce.RefundSucceeded || results[i].Reference != call.Reference {
					t.Fatalf("Refund %d = %+v, %v; want succeeded", i, results[i], errs[i])
				}
			}
			// A second refund of more than remains moves nothing.
			over := call
			over.Reference, over.AmountCents = "re_rf_over", 1990
			res, err := r.Refund(t.Context(), over)
			if err == nil && res.Status == chargeonce.RefundSucceeded {
				t.Fatalf("a refund of 1990 after 1000 of a 1990 capture succeeded: %+v", res)
			}
		}},
		{"RefundLookupHonest", func(t testing.TB, h Harness) {
			r := refunder(t, h)
			captured(t, h, "ch_rf_look")
			lr, err := r.RefundLookup(t.Context(), chargeonce.LookupRequest{Reference: "re_rf_look"})
			if err != nil || lr.Status == chargeonce.LookupFound {
				t.Fatalf("RefundLookup of a refund never sent = %+v, %v; want not found", lr, err)
			}
			call := chargeonce.RefundCall{Reference: "re_rf_look", ChargeReference: "ch_rf_look", Merchant: "demo", AmountCents: 500, Currency: "BRL"}
			if _, err := r.Refund(t.Context(), call); err != nil {
				t.Fatalf("Refund: %v", err)
			}
			lr, err = r.RefundLookup(t.Context(), chargeonce.LookupRequest{Reference: "re_rf_look"})
			if err != nil || lr.Status != chargeonce.LookupFound || lr.Refund.Status != chargeonce.RefundSucceeded || lr.Refund.Reference != call.Reference {
				t.Fatalf("RefundLookup after the refund = %+v, %v; want found, succeeded", lr, err)
			}
		}},
		{"RefundInvalidIsRejected", func(t testing.TB, h Harness) {
			r := refunder(t, h)
			_, err := r.Refund(t.Context(), chargeonce.RefundCall{Reference: "re_rf_bad", ChargeReference: "ch_x", Merchant: "demo", AmountCents: 0, Currency: "BRL"})
			if !errors.Is(err, chargeonce.ErrCaptureRejected) {
				t.Fatalf("a refund of 0: %v; want ErrCaptureRejected", err)
			}
		}},
	}
}
