package stripe_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/acquirer/stripe"
	"github.com/chargeonce/chargeonce/acquirer/stripetest"
)

func opCall(ref, chargeRef string, amount int64) chargeonce.OperationCall {
	return chargeonce.OperationCall{Reference: ref, ChargeReference: chargeRef, Merchant: "demo", AmountCents: amount, Currency: "BRL"}
}

// authorize authorizes ref with pm, re-sending it once when the first
// answer was lost (a fault payment method strikes the first request).
func authorize(t *testing.T, e *env, ref, pm string) {
	t.Helper()
	res, err := e.acq.Authorize(t.Context(), capture(ref, pm))
	if err != nil {
		res, err = e.acq.Authorize(t.Context(), capture(ref, pm))
	}
	if err != nil || res.Status != chargeonce.StatusAuthorized {
		t.Fatalf("Authorize(%s, %s) = %+v, %v; want authorized", ref, pm, res, err)
	}
}

// otherInstance is a second adapter on e's fake: it remembers nothing of
// what e.acq sent, as after a crash or on another instance.
func otherInstance(t *testing.T, e *env, o stripe.Options) *stripe.Acquirer {
	t.Helper()
	retries := int64(0)
	o.Key, o.APIBase, o.MaxNetworkRetries = testKey, e.url, &retries
	acq, err := stripe.New(o)
	if err != nil {
		t.Fatal(err)
	}
	return acq
}

// operationLookup is the lookup the engine makes of an operation of the
// authorization chargeRef, first sent age ago, whose PaymentIntent id was
// never recorded (the instance died before it could).
func operationLookup(ref, chargeRef string, kind chargeonce.RecordKind, age time.Duration, purpose chargeonce.LookupPurpose) chargeonce.LookupRequest {
	rec := chargeonce.KeyRecord{
		Age:       age,
		Charge:    chargeonce.Charge{ID: chargeRef, CaptureMethod: chargeonce.CaptureManual, Status: chargeonce.StatusAuthorized},
		Operation: &chargeonce.Operation{ID: ref, Kind: kind, ChargeID: chargeRef},
	}
	return rec.LookupRequest(purpose)
}

// TestAuthorizeSendsManualCapture: an authorization is Capture's request
// (metadata, Idempotency-Key = the charge reference) with capture_method
// manual; Stripe holds the amount and receives nothing.
func TestAuthorizeSendsManualCapture(t *testing.T) {
	t.Parallel()
	e := setup(t, stripetest.Options{}, stripe.Options{}, 0)
	authorize(t, e, "ch_auth", stripetest.PMOK)
	var found bool
	for _, r := range e.fake.Requests() {
		if r.Path != "/v1/payment_intents" || r.Form.Get("metadata[chargeonce_reference]") != "ch_auth" {
			continue
		}
		found = true
		for k, want := range map[string]string{"capture_method": "manual", "confirm": "true", "amount": "1990", "metadata[order_id]": "42"} {
			if got := r.Form.Get(k); got != want {
				t.Errorf("%s = %q, want %q", k, got, want)
			}
		}
		if r.IdempotencyKey != "ch_auth" {
			t.Errorf("Idempotency-Key = %q, want the charge reference", r.IdempotencyKey)
		}
	}
	if !found {
		t.Fatal("no create request for ch_auth")
	}
	if n := e.fake.Captured("ch_auth"); n != 0 {
		t.Fatalf("an authorization received %d", n)
	}
	// Declines are declines, as for a capture.
	if res, err := e.acq.Authorize(t.Context(), capture("ch_auth_dec", stripetest.PMInsufficientFunds)); err != nil || res.DeclineCode != stripetest.DeclineInsufficient {
		t.Fatalf("a declined authorization: %+v, %v", res, err)
	}
}

// TestCaptureAnswerLost: the capture's answer is lost after Stripe
// captured. The outcome is unknown and names the PaymentIntent; a lookup,
// on another instance, by the recorded id or by the charge reference alone,
// finds the capture; a re-send after Stripe forgot the key is refused by
// Stripe (already captured), and the adapter reads that refusal as the
// success it was, never as a failure, and never captures twice.
func TestCaptureAnswerLost(t *testing.T) {
	t.Parallel()
	e := setup(t, stripetest.Options{}, stripe.Options{}, 0)
	ctx := t.Context()
	authorize(t, e, "ch_lost", stripetest.PMFailAfter)
	call := opCall("cp_lost", "ch_lost", 1500)
	res, err := e.acq.CaptureAuthorized(ctx, call)
	if err == nil || errors.Is(err, chargeonce.ErrCaptureRejected) {
		t.Fatalf("CaptureAuthorized = %+v, %v; want an unknown outcome", res, err)
	}
	named, ok := errors.AsType[chargeonce.AcquirerIDError](err)
	if !ok || named.AcquirerID() == "" {
		t.Fatalf("the unknown outcome names no PaymentIntent: %v", err)
	}
	if got := e.fake.Captured("ch_lost"); got != 1500 {
		t.Fatalf("Stripe captured %d; want 1500 (the fault loses the answer after the capture)", got)
	}
	other := otherInstance(t, e, stripe.Options{})
	for name, req := range map[string]chargeonce.LookupRequest{
		"by the recorded id":     {Reference: "cp_lost", AcquirerID: named.AcquirerID()},
		"by the engine's record": operationLookup("cp_lost", "ch_lost", chargeonce.KindCapture, 48*time.Hour, chargeonce.LookupToResend),
		"to resolve":             operationLookup("cp_lost", "ch_lost", chargeonce.KindCapture, time.Minute, chargeonce.LookupToResolve),
	} {
		lr, err := other.OperationLookup(ctx, req)
		if err != nil || lr.Status != chargeonce.LookupFound || lr.Operation.Status != chargeonce.OperationSucceeded || lr.Operation.Reference != "cp_lost" {
			t.Fatalf("OperationLookup %s = %+v, %v; want found, succeeded", name, lr, err)
		}
		t.Logf("OperationLookup %s: %+v", name, lr)
	}

	e.fake.ForgetKeys() // a day later
	res, err = e.acq.CaptureAuthorized(ctx, call)
	if err != nil || res.Status != chargeonce.OperationSucceeded {
		t.Fatalf("the re-send after the key was forgotten = %+v, %v; want the capture it made, succeeded", res, err)
	}
	if got := e.fake.Captured("ch_lost"); got != 1500 {
		t.Fatalf("Stripe captured %d after the re-send; want 1500", got)
	}
}

// TestCancelAfterCaptureIsRefused: a void of a captured authorization
// fails (a definite answer: the money stays captured), and so does a second
// capture under another reference; their lookups say failed too.
func TestCancelAfterCaptureIsRefused(t *testing.T) {
	t.Parallel()
	e := setup(t, stripetest.Options{}, stripe.Options{}, 0)
	ctx := t.Context()
	authorize(t, e, "ch_cap", stripetest.PMOK)
	if res, err := e.acq.CaptureAuthorized(ctx, opCall("cp_cap", "ch_cap", 1000)); err != nil || res.Status != chargeonce.OperationSucceeded {
		t.Fatalf("CaptureAuthorized = %+v, %v; want succeeded", res, err)
	}
	for _, call := range []chargeonce.OperationCall{opCall("vd_cap", "ch_cap", 1990), opCall("cp_cap2", "ch_cap", 500)} {
		settle := e.acq.CaptureAuthorized
		if call.Reference == "vd_cap" {
			settle = e.acq.Void
		}
		res, err := settle(ctx, call)
		if err != nil || res.Status != chargeonce.OperationFailed || res.FailureReason != stripe.OperationFailedCaptured {
			t.Fatalf("%s of a captured authorization = %+v, %v; want failed, %s", call.Reference, res, err, stripe.OperationFailedCaptured)
		}
		lr, err := e.acq.OperationLookup(ctx, chargeonce.LookupRequest{Reference: call.Reference, ChargeReference: "ch_cap"})
		if err != nil || lr.Status != chargeonce.LookupFound || lr.Operation.Status != chargeonce.OperationFailed {
			t.Fatalf("OperationLookup(%s) = %+v, %v; want found, failed", call.Reference, lr, err)
		}
	}
	for _, pi := range e.fake.Intents() {
		if pi.Metadata[stripe.MetaReference] == "ch_cap" && (pi.Status != "succeeded" || pi.AmountReceived != 1000) {
			t.Fatalf("the PaymentIntent is %s with %d received; want succeeded with 1000", pi.Status, pi.AmountReceived)
		}
	}
	// A partial capture took 1000 of 1990, and the lookup of the first
	// capture still finds it.
	if lr, err := e.acq.OperationLookup(ctx, chargeonce.LookupRequest{Reference: "cp_cap"}); err != nil || lr.Operation.Status != chargeonce.OperationSucceeded {
		t.Fatalf("OperationLookup(cp_cap) = %+v, %v; want found, succeeded", lr, err)
	}
}

// TestVoidAnswerLost: the void's answer is lost after Stripe canceled the
// PaymentIntent, and the instance dies before recording its id. Another
// instance looks the void up from the engine's record alone, after
// Stripe's key is gone: it finds the void, through the authorization's
// reference (a cancel leaves no reference to search for).
func TestVoidAnswerLost(t *testing.T) {
	t.Parallel()
	e := setup(t, stripetest.Options{}, stripe.Options{}, 0)
	ctx := t.Context()
	authorize(t, e, "ch_void", stripetest.PMFailAfter)
	res, err := e.acq.Void(ctx, opCall("vd_void", "ch_void", 1990))
	if err == nil || errors.Is(err, chargeonce.ErrCaptureRejected) {
		t.Fatalf("Void = %+v, %v; want an unknown outcome", res, err)
	}
	e.fake.ForgetKeys() // a day later
	other := otherInstance(t, e, stripe.Options{KeyWindow: time.Millisecond, SearchLag: time.Second})
	lr, err := other.OperationLookup(ctx, operationLookup("vd_void", "ch_void", chargeonce.KindCancel, time.Hour, chargeonce.LookupToResend))
	if err != nil || lr.Status != chargeonce.LookupFound || lr.Operation.Status != chargeonce.OperationSucceeded {
		t.Fatalf("OperationLookup of the lost void = %+v, %v; want found, succeeded", lr, err)
	}
	// A capture of it now fails (its first answer is lost too: the payment
	// method strikes the first request of every key).
	if _, err := other.CaptureAuthorized(ctx, opCall("cp_void", "ch_void", 1990)); err == nil {
		t.Fatal("the first capture request of pm_fail_after: want its answer lost")
	}
	if res, err := other.CaptureAuthorized(ctx, opCall("cp_void", "ch_void", 1990)); err != nil || res.FailureReason != stripe.OperationFailedCanceled {
		t.Fatalf("a capture of a voided authorization = %+v, %v; want failed, %s", res, err, stripe.OperationFailedCanceled)
	}
	if n := e.fake.Captured("ch_void"); n != 0 {
		t.Fatalf("a voided authorization received %d", n)
	}
}

// TestOperationOutcomes: a capture's or a void's failures map to the
// charge path's classes: a 5xx before Stripe committed, a 429 (with its
// Retry-After), a changed request under the same key and a wrong API key
// are unknown outcomes naming the PaymentIntent; more than was authorized
// is a rejection that moved nothing; after an unknown outcome that moved
// nothing, the lookup says safe to send and the re-send captures once.
func TestOperationOutcomes(t *testing.T) {
	t.Parallel()
	e := setup(t, stripetest.Options{RetryAfter: 2 * time.Second}, stripe.Options{}, 0)
	ctx := t.Context()

	authorize(t, e, "ch_before", stripetest.PMOK)
	e.fake.FaultOperation("cp_before", stripetest.PMFailBefore)
	call := opCall("cp_before", "ch_before", 1990)
	_, err := e.acq.CaptureAuthorized(ctx, call)
	if named, ok := errors.AsType[chargeonce.AcquirerIDError](err); !ok || named.AcquirerID() == "" || errors.Is(err, chargeonce.ErrCaptureRejected) {
		t.Fatalf("a 500 before the commit: %v; want an unknown outcome naming the PaymentIntent", err)
	}
	if lr, err := e.acq.OperationLookup(ctx, chargeonce.LookupRequest{Reference: "cp_before", ChargeReference: "ch_before"}); err != nil || lr.Status != chargeonce.LookupSafeToSend {
		t.Fatalf("OperationLookup after a 500 before the commit = %+v, %v; want safe to send (the PaymentIntent awaits capture)", lr, err)
	}
	if res, err := e.acq.CaptureAuthorized(ctx, call); err != nil || res.Status != chargeonce.OperationSucceeded {
		t.Fatalf("the re-send = %+v, %v; want succeeded", res, err)
	}
	if got := e.fake.Captured("ch_before"); got != 1990 {
		t.Fatalf("captured %d; want 1990 once", got)
	}

	authorize(t, e, "ch_429", stripetest.PMOK)
	for _, pm := range []string{stripetest.PMRateLimited, stripetest.PMUnavailable} {
		ref := "vd_" + pm
		e.fake.FaultOperation(ref, pm)
		_, err = e.acq.Void(ctx, opCall(ref, "ch_429", 1990))
		ra, ok := errors.AsType[interface {
			error
			RetryAfter() time.Duration
		}](err)
		if !ok || ra.RetryAfter() != 2*time.Second || errors.Is(err, chargeonce.ErrCaptureRejected) {
			t.Fatalf("%s: %v; want an unknown outcome asking to retry after 2s", pm, err)
		}
		if _, ok := errors.AsType[chargeonce.AcquirerIDError](err); !ok {
			t.Fatalf("%s: %v; want it to name the PaymentIntent", pm, err)
		}
	}

	authorize(t, e, "ch_over", stripetest.PMOK)
	if _, err := e.acq.CaptureAuthorized(ctx, opCall("cp_over", "ch_over", 1991)); !errors.Is(err, chargeonce.ErrCaptureRejected) {
		t.Fatalf("a capture past the authorization: %v; want a rejection", err)
	}
	if _, err := e.acq.CaptureAuthorized(ctx, opCall("cp_twice", "ch_over", 500)); err != nil {
		t.Fatal(err)
	}
	if _, err := e.acq.CaptureAuthorized(ctx, opCall("cp_twice", "ch_over", 600)); err == nil || errors.Is(err, chargeonce.ErrCaptureRejected) {
		t.Fatalf("another amount under the same key (idempotency_error): %v; want an unknown outcome", err)
	}

	wrong := otherInstance(t, e, stripe.Options{})
	wrongKey, err := stripe.New(stripe.Options{Key: "sk_test_wrong", APIBase: e.url})
	if err != nil {
		t.Fatal(err)
	}
	authorize(t, &env{fake: e.fake, acq: wrong, url: e.url}, "ch_key", stripetest.PMOK)
	if _, err := wrongKey.Void(ctx, opCall("vd_key", "ch_key", 1990)); err == nil || errors.Is(err, chargeonce.ErrCaptureRejected) {
		t.Fatalf("a wrong API key: %v; want an unknown outcome", err)
	}
	if _, err := e.acq.Void(ctx, opCall("", "ch_key", 1990)); !errors.Is(err, chargeonce.ErrCaptureRejected) {
		t.Fatalf("a void without a reference: %v; want a rejection", err)
	}
}

// TestAuthorizationExpiredAtStripe: Stripe cancels an authorization nobody
// captured (automatic). A void that comes after it succeeds, since the
// authorization is released as asked (an answer of failed would leave the
// charge authorized here for ever); a capture fails; the charge's lookup,
// on any instance, finds what the charge did: authorized (recovery
// settles the charge so, and the void then cancels it).
func TestAuthorizationExpiredAtStripe(t *testing.T) {
	t.Parallel()
	e := setup(t, stripetest.Options{}, stripe.Options{}, 0)
	ctx := t.Context()
	authorize(t, e, "ch_exp", stripetest.PMOK)
	if !e.fake.Expire("ch_exp") {
		t.Fatal("no authorization to expire")
	}
	if res, err := e.acq.CaptureAuthorized(ctx, opCall("cp_exp", "ch_exp", 1990)); err != nil || res.FailureReason != stripe.OperationFailedCanceled {
		t.Fatalf("a capture of an expired authorization = %+v, %v; want failed, %s", res, err, stripe.OperationFailedCanceled)
	}
	if res, err := e.acq.Void(ctx, opCall("vd_exp", "ch_exp", 1990)); err != nil || res.Status != chargeonce.OperationSucceeded {
		t.Fatalf("a void of an expired authorization = %+v, %v; want succeeded", res, err)
	}
	other := otherInstance(t, e, stripe.Options{})
	lr, err := other.Lookup(ctx, chargeonce.LookupRequest{Reference: "ch_exp", Purpose: chargeonce.LookupToResolve, Age: time.Hour, AgeKnown: true})
	if err != nil || lr.Status != chargeonce.LookupFound || lr.Result.Status != chargeonce.StatusAuthorized || !lr.Binding {
		t.Fatalf("Lookup of the expired authorization = %+v, %v; want found, authorized, binding", lr, err)
	}
	// A PaymentIntent canceled without an authorization is a decline.
	if _, err := e.acq.Authorize(ctx, capture("ch_exp_dec", stripetest.PMDeclined)); err != nil {
		t.Fatal(err)
	}
	if _, err := e.acq.Void(ctx, opCall("vd_exp_dec", "ch_exp_dec", 1990)); err != nil {
		t.Fatal(err)
	}
	lr, err = other.Lookup(ctx, chargeonce.LookupRequest{Reference: "ch_exp_dec", Purpose: chargeonce.LookupToResolve, Age: time.Hour, AgeKnown: true})
	if err != nil || lr.Status != chargeonce.LookupFound || lr.Result.Status != chargeonce.StatusDeclined {
		t.Fatalf("Lookup of a declined authorization, canceled = %+v, %v; want found, declined", lr, err)
	}
}

// TestLookupOfAnAuthorization: a charge's lookup finds its authorization
// authorized (never unsure for ever, as an open PaymentIntent would be), on
// the instance that made it and, through Search, on another; still
// authorized once captured (the charge's own answer; the capture's lookup
// tells of the capture), never the capture of an automatic charge.
func TestLookupOfAnAuthorization(t *testing.T) {
	t.Parallel()
	e := setup(t, stripetest.Options{}, stripe.Options{}, 0)
	ctx := t.Context()
	authorize(t, e, "ch_look", stripetest.PMOK)
	other := otherInstance(t, e, stripe.Options{})
	for name, acq := range map[string]*stripe.Acquirer{"this instance": e.acq, "another instance": other} {
		lr, err := acq.Lookup(ctx, chargeonce.LookupRequest{Reference: "ch_look", Purpose: chargeonce.LookupToResolve, Age: 2 * time.Hour, AgeKnown: true})
		if err != nil || lr.Status != chargeonce.LookupFound || lr.Result.Status != chargeonce.StatusAuthorized || !lr.Binding {
			t.Fatalf("Lookup on %s = %+v, %v; want found, authorized, binding", name, lr, err)
		}
	}
	if _, err := e.acq.CaptureAuthorized(ctx, opCall("cp_look", "ch_look", 1990)); err != nil {
		t.Fatal(err)
	}
	if lr, err := other.Lookup(ctx, chargeonce.LookupRequest{Reference: "ch_look", Purpose: chargeonce.LookupToResolve, Age: 2 * time.Hour, AgeKnown: true}); err != nil || lr.Result.Status != chargeonce.StatusAuthorized || !lr.Binding {
		t.Fatalf("Lookup after the capture = %+v, %v; want authorized, binding", lr, err)
	} else {
		t.Logf("Lookup after the capture: %+v", lr)
	}
}

// TestSettleRace: captures and voids of one authorization race, each under
// its own reference, from many goroutines. Stripe settles an
// authorization once: either one capture succeeded and every other
// operation failed, or it was voided and no capture succeeded; the money
// received is one capture's, at most what was authorized.
func TestSettleRace(t *testing.T) {
	t.Parallel()
	e := setup(t, stripetest.Options{}, stripe.Options{}, 0)
	ctx := t.Context()
	authorize(t, e, "ch_race", stripetest.PMOK)
	const n = 16
	var wg sync.WaitGroup
	results := make([]chargeonce.OperationResult, 2*n)
	errs := make([]error, 2*n)
	for i := range n {
		wg.Go(func() {
			results[i], errs[i] = e.acq.CaptureAuthorized(ctx, opCall(fmt.Sprintf("cp_race_%02d", i), "ch_race", 1000+int64(i)))
		})
		wg.Go(func() {
			results[n+i], errs[n+i] = e.acq.Void(ctx, opCall(fmt.Sprintf("vd_race_%02d", i), "ch_race", 1990))
		})
	}
	wg.Wait()
	var captured, voided int
	for i := range results {
		if errs[i] != nil {
			t.Fatalf("operation %d: %v; want a definite answer", i, errs[i])
		}
		if results[i].Status != chargeonce.OperationSucceeded {
			continue
		}
		if i < n {
			captured++
		} else {
			voided++
		}
	}
	t.Logf("%d captures and %d voids succeeded", captured, voided)
	switch {
	case captured == 1 && voided == 0:
		if got := e.fake.Captured("ch_race"); got < 1000 || got >= 1000+n {
			t.Fatalf("received %d; want one capture's amount", got)
		}
	case captured == 0 && voided > 0:
		if got := e.fake.Captured("ch_race"); got != 0 {
			t.Fatalf("a voided authorization received %d", got)
		}
	default:
		t.Fatalf("%d captures and %d voids succeeded; want one capture, or voids only", captured, voided)
	}
}

// TestRefundOfAManualCapture: a partial capture is what can be refunded,
// at Stripe as here: a refund past the amount received is refused, one of
// it succeeds, through the PaymentIntent the authorization made.
func TestRefundOfAManualCapture(t *testing.T) {
	t.Parallel()
	e := setup(t, stripetest.Options{}, stripe.Options{}, 0)
	ctx := t.Context()
	authorize(t, e, "ch_rf", stripetest.PMOK)
	if _, err := e.acq.CaptureAuthorized(ctx, opCall("cp_rf", "ch_rf", 1000)); err != nil {
		t.Fatal(err)
	}
	refund := chargeonce.RefundCall{Reference: "re_rf_over", ChargeReference: "ch_rf", Merchant: "demo", AmountCents: 1001, Currency: "BRL"}
	if res, err := e.acq.Refund(ctx, refund); !errors.Is(err, chargeonce.ErrCaptureRejected) {
		t.Fatalf("a refund of 1001 of a capture of 1000 = %+v, %v; want a rejection", res, err)
	}
	refund.Reference, refund.AmountCents = "re_rf", 1000
	if res, err := e.acq.Refund(ctx, refund); err != nil || res.Status != chargeonce.RefundSucceeded {
		t.Fatalf("a refund of the capture = %+v, %v; want succeeded", res, err)
	}
}
