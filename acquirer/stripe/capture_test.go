package stripe_test

import (
	"errors"
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
	const keyTTL = 500 * time.Millisecond
	e := setup(t, stripetest.Options{KeyTTL: keyTTL}, stripe.Options{}, 0)
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

	time.Sleep(keyTTL + 100*time.Millisecond) // Stripe forgets the key
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
	const keyTTL = 500 * time.Millisecond
	e := setup(t, stripetest.Options{KeyTTL: keyTTL}, stripe.Options{}, 0)
	ctx := t.Context()
	authorize(t, e, "ch_void", stripetest.PMFailAfter)
	res, err := e.acq.Void(ctx, opCall("vd_void", "ch_void", 1990))
	if err == nil || errors.Is(err, chargeonce.ErrCaptureRejected) {
		t.Fatalf("Void = %+v, %v; want an unknown outcome", res, err)
	}
	time.Sleep(keyTTL + 100*time.Millisecond) // Stripe forgets the key
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
