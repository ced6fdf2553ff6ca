package acquirertest

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
)

// RunManualCapture runs the manual capture checks on an adapter that can
// authorize, capture and void (chargeonce.ManualCapturer): every adapter
// that offers capture_method manual must pass them, and one whose Acquirer
// is no ManualCapturer fails.
func RunManualCapture(t *testing.T, newHarness func(t *testing.T) Harness) {
	t.Helper()
	for _, c := range ManualCaptureChecks() {
		t.Run(c.Name, func(t *testing.T) {
			t.Parallel()
			c.Run(t, newHarness(t))
		})
	}
}

func manualCapturer(t testing.TB, h Harness) chargeonce.ManualCapturer {
	t.Helper()
	m, ok := h.Acquirer.(chargeonce.ManualCapturer)
	if !ok {
		t.Fatalf("%T cannot capture manually: it is no chargeonce.ManualCapturer", h.Acquirer)
	}
	return m
}

// authorized authorizes ref with the harness's OK token, failing t
// otherwise.
func authorized(t testing.TB, h Harness, m chargeonce.ManualCapturer, ref string) {
	t.Helper()
	if res, err := m.Authorize(t.Context(), req(ref, h.OK)); err != nil || res.Status != chargeonce.StatusAuthorized || res.Reference != ref {
		t.Fatalf("Authorize(%s) = %+v, %v; want authorized", ref, res, err)
	}
}

func opCall(ref, chargeRef string, amount int64) chargeonce.OperationCall {
	return chargeonce.OperationCall{Reference: ref, ChargeReference: chargeRef, Merchant: "demo", AmountCents: amount, Currency: "BRL"}
}

// ManualCaptureChecks returns the manual capture checks.
func ManualCaptureChecks() []Check {
	return []Check{
		{"AuthorizeMovesNothing", func(t testing.TB, h Harness) {
			m := manualCapturer(t, h)
			authorized(t, h, m, "ch_mc_auth")
			if h.Captures != nil {
				if n := h.Captures("ch_mc_auth"); n != 0 {
					t.Fatalf("an authorization moved money: %d captures", n)
				}
			}
			// Idempotent by reference, and found by Lookup as authorized.
			authorized(t, h, m, "ch_mc_auth")
			lr := lookup(t, h, "ch_mc_auth", time.Now())
			if lr.Status != chargeonce.LookupFound || lr.Result.Status != chargeonce.StatusAuthorized {
				t.Fatalf("Lookup of an authorization = %+v; want found, authorized", lr)
			}
			if res, err := m.Authorize(t.Context(), req("ch_mc_decl", h.Declined)); err != nil || res.Status != chargeonce.StatusDeclined {
				t.Fatalf("Authorize(declined token) = %+v, %v; want declined", res, err)
			}
		}},
		{"CaptureOnceByReference", func(t testing.TB, h Harness) {
			m := manualCapturer(t, h)
			authorized(t, h, m, "ch_mc_cap")
			call := opCall("cp_mc_cap", "ch_mc_cap", 1500)
			var wg sync.WaitGroup
			results := make([]chargeonce.OperationResult, 10)
			errs := make([]error, 10)
			for i := range results {
				wg.Go(func() { results[i], errs[i] = m.CaptureAuthorized(t.Context(), call) })
			}
			wg.Wait()
			for i := range results {
				if errs[i] != nil || results[i].Status != chargeonce.OperationSucceeded || results[i].Reference != call.Reference {
					t.Fatalf("CaptureAuthorized %d = %+v, %v; want succeeded", i, results[i], errs[i])
				}
			}
			// Settled once: another capture and a void move nothing.
			for _, f := range []func() (chargeonce.OperationResult, error){
				func() (chargeonce.OperationResult, error) {
					return m.CaptureAuthorized(t.Context(), opCall("cp_mc_cap2", "ch_mc_cap", 100))
				},
				func() (chargeonce.OperationResult, error) {
					return m.Void(t.Context(), opCall("vd_mc_cap", "ch_mc_cap", 1990))
				},
			} {
				if res, err := f(); err == nil && res.Status == chargeonce.OperationSucceeded {
					t.Fatalf("a second settlement of a captured authorization succeeded: %+v", res)
				}
			}
		}},
		{"CaptureBeyondAuthorizedFails", func(t testing.TB, h Harness) {
			m := manualCapturer(t, h)
			authorized(t, h, m, "ch_mc_over")
			res, err := m.CaptureAuthorized(t.Context(), opCall("cp_mc_over", "ch_mc_over", 1991))
			if err == nil && res.Status == chargeonce.OperationSucceeded {
				t.Fatalf("a capture of 1991 of an authorization of 1990 succeeded: %+v", res)
			}
			// The authorization is still open: a void succeeds.
			if res, err := m.Void(t.Context(), opCall("vd_mc_over", "ch_mc_over", 1990)); err != nil || res.Status != chargeonce.OperationSucceeded {
				t.Fatalf("Void after a refused capture = %+v, %v; want succeeded", res, err)
			}
		}},
		{"VoidThenCaptureFails", func(t testing.TB, h Harness) {
			m := manualCapturer(t, h)
			authorized(t, h, m, "ch_mc_void")
			if res, err := m.Void(t.Context(), opCall("vd_mc_void", "ch_mc_void", 1990)); err != nil || res.Status != chargeonce.OperationSucceeded {
				t.Fatalf("Void = %+v, %v; want succeeded", res, err)
			}
			if res, err := m.CaptureAuthorized(t.Context(), opCall("cp_mc_void", "ch_mc_void", 1990)); err == nil && res.Status == chargeonce.OperationSucceeded {
				t.Fatalf("a capture of a voided authorization succeeded: %+v", res)
			}
			if h.Captures != nil {
				if n := h.Captures("ch_mc_void"); n != 0 {
					t.Fatalf("a voided authorization moved money: %d captures", n)
				}
			}
		}},
		{"OperationLookupHonest", func(t testing.TB, h Harness) {
			m := manualCapturer(t, h)
			authorized(t, h, m, "ch_mc_look")
			lr, err := m.OperationLookup(t.Context(), chargeonce.LookupRequest{Reference: "cp_mc_look"})
			if err != nil || lr.Status == chargeonce.LookupFound {
				t.Fatalf("OperationLookup of a capture never sent = %+v, %v; want not found", lr, err)
			}
			if _, err := m.CaptureAuthorized(t.Context(), opCall("cp_mc_look", "ch_mc_look", 700)); err != nil {
				t.Fatalf("CaptureAuthorized: %v", err)
			}
			lr, err = m.OperationLookup(t.Context(), chargeonce.LookupRequest{Reference: "cp_mc_look"})
			if err != nil || lr.Status != chargeonce.LookupFound || lr.Operation.Status != chargeonce.OperationSucceeded || lr.Operation.Reference != "cp_mc_look" {
				t.Fatalf("OperationLookup after the capture = %+v, %v; want found, succeeded", lr, err)
			}
		}},
		{"OperationInvalidIsRejected", func(t testing.TB, h Harness) {
			m := manualCapturer(t, h)
			_, err := m.CaptureAuthorized(t.Context(), opCall("cp_mc_bad", "ch_x", 0))
			if !errors.Is(err, chargeonce.ErrCaptureRejected) {
				t.Fatalf("a capture of 0: %v; want ErrCaptureRejected", err)
			}
		}},
	}
}
