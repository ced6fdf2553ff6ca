package acquirer_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/acquirer"
)

// captureFor captures (or, manual, authorizes) ref with token, waiting for
// it however slow the token is.
func captureFor(t *testing.T, sim *acquirer.Simulator, ref, token string, manual bool) {
	t.Helper()
	req := chargeonce.CaptureRequest{Reference: ref, OrderID: 1, Merchant: "m", AmountCents: 100, Currency: "BRL", PaymentToken: token}
	send := sim.Capture
	if manual {
		send = sim.Authorize
	}
	if _, err := send(t.Context(), req); err != nil {
		t.Fatalf("capture %s: %v", ref, err)
	}
}

// TestRequestsLandAfterTheCallerGaveUp (issue 47, item 5): a refund, a
// capture or a void of an authorization whose caller stopped waiting still
// lands at the simulator, as a request we gave up on may reach a real
// acquirer: tok_slow delays its first request by --slow, the caller's
// deadline is shorter, and the request settles afterwards all the same. On
// the old simulator the wait ended with the caller and nothing settled.
func TestRequestsLandAfterTheCallerGaveUp(t *testing.T) {
	t.Parallel()
	sim := acquirer.NewSimulator(acquirer.Options{Slow: 300 * time.Millisecond})
	t.Cleanup(func() { sim.Close() })
	captureFor(t, sim, "ch_slow", acquirer.TokenSlow, false)
	captureFor(t, sim, "ch_auth", acquirer.TokenSlow, true)
	captureFor(t, sim, "ch_auth2", acquirer.TokenSlow, true)

	gaveUp := func() context.Context {
		ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
		t.Cleanup(cancel)
		return ctx
	}
	if _, err := sim.Refund(gaveUp(), chargeonce.RefundCall{Reference: "re_late", ChargeReference: "ch_slow", Merchant: "m", AmountCents: 40, Currency: "BRL"}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a slow refund with a 50 ms deadline: %v, want the deadline", err)
	}
	op := func(ref, charge string) chargeonce.OperationCall {
		return chargeonce.OperationCall{Reference: ref, ChargeReference: charge, Merchant: "m", AmountCents: 100, Currency: "BRL"}
	}
	if _, err := sim.CaptureAuthorized(gaveUp(), op("cp_late", "ch_auth")); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a slow capture with a 50 ms deadline: %v, want the deadline", err)
	}
	if _, err := sim.Void(gaveUp(), op("vd_late", "ch_auth2")); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a slow void with a 50 ms deadline: %v, want the deadline", err)
	}
	// Nothing has landed yet: the lookups say so.
	if lr, _ := sim.RefundLookup(t.Context(), chargeonce.LookupRequest{Reference: "re_late"}); lr.Status != chargeonce.LookupSafeToSend {
		t.Fatalf("the refund before it landed: %+v", lr)
	}
	sim.Close() // waits for the requests it accepted; they land at once
	if rf, ok := sim.GetRefund("re_late"); !ok || rf.Status != chargeonce.RefundSucceeded || sim.RefundedCents("ch_slow") != 40 {
		t.Fatalf("the refund whose caller gave up: %+v found=%t, refunded %d; want it landed", rf, ok, sim.RefundedCents("ch_slow"))
	}
	if captured, _ := sim.Authorization("ch_auth"); captured != 100 {
		t.Fatalf("the capture whose caller gave up captured %d, want 100", captured)
	}
	if _, voided := sim.Authorization("ch_auth2"); !voided {
		t.Fatal("the void whose caller gave up did not land")
	}
}

// TestFenceRefusesWhatLandsLate (SPEC "Finality"): a fenced reference of
// any kind refuses every later request, which moves nothing and answers a
// definite refusal (ErrTooLate, chargeonce.ErrCaptureRejected); a fence of
// a reference that landed answers what landed and fences nothing; and a
// request that lands past the acceptance window is refused too.
func TestFenceRefusesWhatLandsLate(t *testing.T) {
	t.Parallel()
	sim := acquirer.NewSimulator(acquirer.Options{Slow: 300 * time.Millisecond, AcceptanceWindow: 200 * time.Millisecond})
	t.Cleanup(func() { sim.Close() })
	captureFor(t, sim, "ch_ok", acquirer.TokenOK, false)
	captureFor(t, sim, "ch_auth", acquirer.TokenOK, true)

	fence := func(ref string, kind chargeonce.RecordKind) chargeonce.LookupResult {
		t.Helper()
		lr, err := sim.Fence(t.Context(), chargeonce.LookupRequest{Reference: ref, Kind: kind})
		if err != nil {
			t.Fatalf("fence %s: %v", ref, err)
		}
		return lr
	}
	refusedLate := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, acquirer.ErrTooLate) || !errors.Is(err, chargeonce.ErrCaptureRejected) {
			t.Fatalf("%s: %v, want a definite refusal (ErrTooLate)", what, err)
		}
	}
	for _, c := range []struct {
		ref  string
		kind chargeonce.RecordKind
	}{{"ch_fenced", chargeonce.KindCharge}, {"re_fenced", chargeonce.KindRefund}, {"cp_fenced", chargeonce.KindCapture}} {
		if lr := fence(c.ref, c.kind); lr.Status != chargeonce.LookupSafeToSend || !lr.Fenced {
			t.Fatalf("fencing %s, never seen: %+v, want fenced", c.ref, lr)
		}
	}
	_, err := sim.Capture(t.Context(), chargeonce.CaptureRequest{Reference: "ch_fenced", OrderID: 2, Merchant: "m", AmountCents: 100, Currency: "BRL", PaymentToken: "tok_ok"})
	refusedLate("a capture under a fence", err)
	_, err = sim.Refund(t.Context(), chargeonce.RefundCall{Reference: "re_fenced", ChargeReference: "ch_ok", Merchant: "m", AmountCents: 10, Currency: "BRL"})
	refusedLate("a refund under a fence", err)
	_, err = sim.CaptureAuthorized(t.Context(), chargeonce.OperationCall{Reference: "cp_fenced", ChargeReference: "ch_auth", Merchant: "m", AmountCents: 100, Currency: "BRL"})
	refusedLate("a capture of an authorization under a fence", err)
	if sim.RefundedCents("ch_ok") != 0 || sim.Stats().Captures != 1 {
		t.Fatalf("money moved under a fence: refunded %d, captures %d", sim.RefundedCents("ch_ok"), sim.Stats().Captures)
	}
	if captured, _ := sim.Authorization("ch_auth"); captured != 0 {
		t.Fatalf("the fenced capture took %d", captured)
	}
	// What landed is answered, not fenced.
	if lr := fence("ch_ok", chargeonce.KindCharge); lr.Status != chargeonce.LookupFound || lr.Fenced || lr.Result.Status != chargeonce.StatusCaptured {
		t.Fatalf("fencing a captured reference: %+v, want found captured", lr)
	}
	// A request that lands past the window (tok_slow's 300 ms against
	// 200 ms) is refused and moves nothing.
	captureFor(t, sim, "ch_slow", acquirer.TokenSlow, false)
	_, err = sim.Refund(t.Context(), chargeonce.RefundCall{Reference: "re_slow", ChargeReference: "ch_slow", Merchant: "m", AmountCents: 10, Currency: "BRL"})
	refusedLate("a refund landing past the acceptance window", err)
	if got := sim.Stats().LateRequests; got != 4 {
		t.Fatalf("late requests counted: %d, want 4", got)
	}
	if got := sim.AcceptanceWindow(); got != 200*time.Millisecond {
		t.Fatalf("AcceptanceWindow = %s", got)
	}
}

// TestHeldRequestRefusedOverHTTP: over HTTP, a request a proxy held past
// the acceptance window since the Client sent it (SentAtHeader) is refused
// 422 request-too-late, which the Client reads as a definite refusal; the
// fence is served at POST /v1/fences, and ClientFinality reads it.
func TestHeldRequestRefusedOverHTTP(t *testing.T) {
	t.Parallel()
	sim := acquirer.NewSimulator(acquirer.Options{AcceptanceWindow: time.Second})
	t.Cleanup(func() { sim.Close() })
	srv := httptest.NewServer(acquirer.Handler(sim))
	t.Cleanup(srv.Close)
	body := `{"reference":"ch_held","order_id":1,"merchant":"m","amount_cents":100,"currency":"BRL","payment_token":"tok_ok"}`
	req, _ := http.NewRequestWithContext(t.Context(), "POST", srv.URL+"/v1/captures", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(acquirer.SentAtHeader, strconv.FormatInt(time.Now().Add(-2*time.Second).UnixNano(), 10))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusUnprocessableEntity || !acquirer.Rejected(resp.StatusCode) {
		t.Fatalf("a capture held 2 s past a 1 s window: %d, want 422", resp.StatusCode)
	}
	if st := sim.Stats(); st.Captures != 0 || st.LateRequests != 1 {
		t.Fatalf("after the held capture: %+v", st)
	}

	f := acquirer.ClientFinality{Client: acquirer.NewClient(srv.URL, nil), Window: time.Second}
	lr, err := f.Fence(t.Context(), chargeonce.LookupRequest{Reference: "re_x", Kind: chargeonce.KindRefund})
	if err != nil || !lr.Fenced || lr.Status != chargeonce.LookupSafeToSend {
		t.Fatalf("fence over HTTP: %+v, %v", lr, err)
	}
	c := acquirer.NewClient(srv.URL, nil)
	if _, err := c.Capture(t.Context(), chargeonce.CaptureRequest{Reference: "ch_ok", OrderID: 2, Merchant: "m", AmountCents: 100, Currency: "BRL", PaymentToken: "tok_ok"}); err != nil {
		t.Fatal(err)
	}
	lr, err = f.Fence(t.Context(), chargeonce.LookupRequest{Reference: "ch_ok"})
	if err != nil || lr.Fenced || lr.Status != chargeonce.LookupFound || lr.Result.Status != chargeonce.StatusCaptured {
		t.Fatalf("fence of a captured reference over HTTP: %+v, %v", lr, err)
	}
	_, err = c.Refund(t.Context(), chargeonce.RefundCall{Reference: "re_x", ChargeReference: "ch_ok", Merchant: "m", AmountCents: 10, Currency: "BRL"})
	if !errors.Is(err, chargeonce.ErrCaptureRejected) {
		t.Fatalf("a refund under a fence over HTTP: %v, want a definite refusal", err)
	}
	if resp, err := http.Post(srv.URL+"/v1/fences", "application/json", strings.NewReader(`{"reference":"x","kind":"bogus"}`)); err != nil || resp.StatusCode != 400 {
		t.Fatalf("a fence of an unknown kind: %v %v, want 400", resp, err)
	} else {
		_ = resp.Body.Close()
	}
}
