package acquirer_test

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/acquirer"
)

// TestSimulatorManualCapture: an authorization moves nothing until its
// capture; captures and voids are idempotent by reference (50 concurrent
// requests for one capture settle once), follow the authorization's fault
// tokens on their first request only, settle an authorization once
// (capture or void, never both), bound refunds by the captured amount, and
// appear in the ledger as a capture of the captured amount and a void.
func TestSimulatorManualCapture(t *testing.T) {
	t.Parallel()
	sim := acquirer.NewSimulator(acquirer.Options{Slow: 20 * time.Millisecond})
	t.Cleanup(func() { sim.Close() })
	start := time.Now()
	authorize := func(ref, token string) {
		t.Helper()
		for range 2 {
			res, err := sim.Authorize(t.Context(), chargeonce.CaptureRequest{Reference: ref, OrderID: 1, Merchant: "m", AmountCents: 100, Currency: "BRL", PaymentToken: token})
			if err == nil {
				if res.Status != chargeonce.StatusAuthorized {
					t.Fatalf("Authorize(%s) = %+v", ref, res)
				}
				return
			}
		}
		t.Fatalf("authorization %s never settled", ref)
	}
	call := func(ref, charge string, amount int64) chargeonce.OperationCall {
		return chargeonce.OperationCall{Reference: ref, ChargeReference: charge, Merchant: "m", AmountCents: amount, Currency: "BRL"}
	}
	authorize("ch_a", acquirer.TokenOK)
	if n := sim.CapturedCount("m", 1); n != 0 {
		t.Fatalf("an authorization captured: %d", n)
	}
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() {
			if res, err := sim.CaptureAuthorized(t.Context(), call("cp_a", "ch_a", 60)); err != nil || res.Status != chargeonce.OperationSucceeded {
				t.Errorf("CaptureAuthorized = %+v, %v", res, err)
			}
		})
	}
	wg.Wait()
	if st := sim.Stats(); st.AuthorizationCaptures != 1 || st.DuplicateOperationRequests != 49 || st.Authorizations != 1 {
		t.Fatalf("stats after 50 requests for one capture: %+v", st)
	}
	if res, err := sim.Void(t.Context(), call("vd_a", "ch_a", 100)); err != nil || res.Status != chargeonce.OperationFailed {
		t.Fatalf("Void of a captured authorization = %+v, %v; want failed", res, err)
	}
	if captured, voided := sim.Authorization("ch_a"); captured != 60 || voided {
		t.Fatalf("ch_a: captured %d, voided %v; want 60, false", captured, voided)
	}
	// Refunds are bounded by the 60 captured, not the 100 authorized.
	if res, _ := sim.Refund(t.Context(), chargeonce.RefundCall{Reference: "re_a", ChargeReference: "ch_a", Merchant: "m", AmountCents: 70, Currency: "BRL"}); res.Status != chargeonce.RefundFailed {
		t.Fatalf("a refund of 70 of a capture of 60: %+v", res)
	}
	if res, _ := sim.Refund(t.Context(), chargeonce.RefundCall{Reference: "re_b", ChargeReference: "ch_a", Merchant: "m", AmountCents: 60, Currency: "BRL"}); res.Status != chargeonce.RefundSucceeded {
		t.Fatalf("a refund of 60 of a capture of 60: %+v", res)
	}

	// Fault tokens: the first request only.
	for _, tc := range []struct {
		token   string
		settled bool // by the failing first request
	}{{acquirer.TokenFailBefore, false}, {acquirer.TokenFailAfter, true}, {acquirer.TokenSlow, true}} {
		ch := "ch_" + tc.token
		authorize(ch, tc.token)
		ref := "vd_" + tc.token
		res, err := sim.Void(t.Context(), call(ref, ch, 100))
		_, found := sim.GetOperation(ref)
		if found != tc.settled {
			t.Fatalf("%s: the first void settled=%v; want %v (answer %+v, %v)", tc.token, found, tc.settled, res, err)
		}
		lr, lerr := sim.OperationLookup(t.Context(), chargeonce.LookupRequest{Reference: ref})
		if lerr != nil || (lr.Status == chargeonce.LookupFound) != tc.settled {
			t.Fatalf("%s: lookup after the first void = %+v, %v", tc.token, lr, lerr)
		}
		if res, err := sim.Void(t.Context(), call(ref, ch, 100)); err != nil || res.Status != chargeonce.OperationSucceeded {
			t.Fatalf("%s: the void's retry = %+v, %v; want succeeded", tc.token, res, err)
		}
		if _, voided := sim.Authorization(ch); !voided {
			t.Fatalf("%s: not voided", tc.token)
		}
	}
	if st := sim.Stats(); st.Voids != 3 {
		t.Fatalf("voids: %d; want 3", st.Voids)
	}

	page, err := sim.LedgerList(t.Context(), chargeonce.LedgerParams{From: start.Add(-time.Second), To: time.Now().Add(time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range page.Entries {
		got = append(got, fmt.Sprintf("%s %s/%s %d %s", e.Kind, e.Reference, e.ChargeReference, e.AmountCents, e.Status))
	}
	// Every authorization is listed (it moves nothing), and its capture
	// or void under the charge's reference with the operation's own.
	want := []string{
		"authorization ch_a/ch_a 100 authorized", "manual_capture cp_a/ch_a 60 succeeded",
		"refund re_a/ch_a 70 failed", "refund re_b/ch_a 60 succeeded",
		"authorization ch_tok_fail_after/ch_tok_fail_after 100 authorized",
		"void vd_tok_fail_after/ch_tok_fail_after 100 succeeded",
		"authorization ch_tok_fail_before/ch_tok_fail_before 100 authorized",
		"void vd_tok_fail_before/ch_tok_fail_before 100 succeeded",
		"authorization ch_tok_slow/ch_tok_slow 100 authorized",
		"void vd_tok_slow/ch_tok_slow 100 succeeded",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("ledger:\n%q\nwant\n%q", got, want)
	}
}
