package stripe

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	stripego "github.com/stripe/stripe-go/v82"

	"github.com/chargeonce/chargeonce"
)

// MetaCaptureReference is the metadata key under which a capture of an
// authorization writes its own reference onto the PaymentIntent. Stripe's
// capture takes metadata in the same request, so the PaymentIntent that
// succeeded carries the reference of the capture that moved the money:
// OperationLookup reads it there.
const MetaCaptureReference = "chargeonce_capture_reference"

// VoidReason is the cancellation_reason of a void. Stripe offers four
// (duplicate, fraudulent, requested_by_customer, abandoned); chargeonce
// does not know why a merchant or the sweeper releases an authorization,
// and "abandoned" claims least while telling our voids from Stripe's own
// cancellations (automatic, expired).
const VoidReason = stripego.PaymentIntentCancellationReasonAbandoned

// Failure reasons of captures and voids that moved nothing.
const (
	// OperationFailedCaptured: the authorization was captured already (by
	// another capture, or outside chargeonce).
	OperationFailedCaptured = "authorization_captured"
	// OperationFailedCanceled: the authorization was canceled already (a
	// void, or Stripe's own expiry of an uncaptured PaymentIntent).
	OperationFailedCanceled = "authorization_canceled"
	// OperationFailedNotOpen: the PaymentIntent never reached
	// requires_capture (its authorization failed).
	OperationFailedNotOpen = "authorization_not_open"
)

var _ chargeonce.ManualCapturer = (*Acquirer)(nil)

// Authorize implements chargeonce.ManualCapturer: Capture's PaymentIntent
// (the same metadata, Idempotency-Key = the charge reference, the same
// outcomes) with capture_method manual, which Stripe leaves in
// requires_capture: authorized. The money is held on the card, not moved.
func (a *Acquirer) Authorize(ctx context.Context, req chargeonce.CaptureRequest) (chargeonce.CaptureResult, error) {
	return a.create(ctx, req, true)
}

// opKind is what an operation does to an authorization.
type opKind int

const (
	opCapture opKind = iota
	opVoid
)

func (k opKind) String() string {
	if k == opVoid {
		return "voiding"
	}
	return "capturing"
}

// kindOf tells a capture's reference from a void's by the prefix chargeonce
// gives operation ids (cp_, vd_); ok is false for any other reference.
func kindOf(reference string) (k opKind, ok bool) {
	switch {
	case strings.HasPrefix(reference, "cp_"):
		return opCapture, true
	case strings.HasPrefix(reference, "vd_"):
		return opVoid, true
	}
	return 0, false
}

// CaptureAuthorized implements chargeonce.ManualCapturer: POST
// /v1/payment_intents/{id}/capture of the authorization's PaymentIntent
// with amount_to_capture, its reference in the metadata
// (MetaCaptureReference) and as the Idempotency-Key. Stripe captures a
// PaymentIntent once: a second capture, of any reference, is refused.
//
// The outcomes: succeeded (captured), or failed when Stripe refused it
// because the PaymentIntent is no longer awaiting capture (captured or
// canceled: see settled) or for a card error; chargeonce.ErrCaptureRejected
// for another 4xx about the request (more than was authorized), which moved
// nothing; an unknown outcome (network errors, timeouts, 5xx, 429,
// idempotency errors) names the PaymentIntent (chargeonce.AcquirerIDError),
// so that recovery's lookup retrieves it. A PaymentIntent not found (Search
// lags behind an authorization made by another instance) is an unknown
// outcome with nothing sent.
func (a *Acquirer) CaptureAuthorized(ctx context.Context, req chargeonce.OperationCall) (chargeonce.OperationResult, error) {
	if err := checkOperation(req, opCapture); err != nil {
		return chargeonce.OperationResult{}, err
	}
	amount, err := Amount(req.AmountCents, req.Currency)
	if err != nil {
		return chargeonce.OperationResult{}, fmt.Errorf("%w: stripe: capturing %s: %w", chargeonce.ErrCaptureRejected, req.Reference, err)
	}
	pi, err := a.authorizationOf(ctx, req, opCapture)
	if err != nil {
		return chargeonce.OperationResult{}, err
	}
	return a.capture(ctx, pi, amount, req)
}

// capture sends the capture of req on the PaymentIntent pi, amount in
// Stripe's units.
func (a *Acquirer) capture(ctx context.Context, pi string, amount int64, req chargeonce.OperationCall) (chargeonce.OperationResult, error) {
	params := &stripego.PaymentIntentCaptureParams{AmountToCapture: stripego.Int64(amount)}
	params.SetIdempotencyKey(req.Reference)
	params.AddMetadata(MetaCaptureReference, req.Reference)
	params.Context = ctx
	got, err := a.sc.V1PaymentIntents.Capture(ctx, pi, params)
	if err != nil {
		return a.operationError(ctx, opCapture, req.Reference, pi, err)
	}
	return answered(opCapture, req.Reference, got)
}

// Void implements chargeonce.ManualCapturer: POST
// /v1/payment_intents/{id}/cancel of the authorization's PaymentIntent
// with cancellation_reason VoidReason and the void's reference as the
// Idempotency-Key. Stripe's cancel takes no metadata, and needs none: the
// lookup of a void reads the PaymentIntent's status (see OperationLookup).
// A void of a PaymentIntent already canceled succeeds (the authorization
// is released, as asked), one of a captured PaymentIntent fails; the other
// outcomes are CaptureAuthorized's.
func (a *Acquirer) Void(ctx context.Context, req chargeonce.OperationCall) (chargeonce.OperationResult, error) {
	if err := checkOperation(req, opVoid); err != nil {
		return chargeonce.OperationResult{}, err
	}
	pi, err := a.authorizationOf(ctx, req, opVoid)
	if err != nil {
		return chargeonce.OperationResult{}, err
	}
	return a.void(ctx, pi, req)
}

// void sends the cancel of req on the PaymentIntent pi.
func (a *Acquirer) void(ctx context.Context, pi string, req chargeonce.OperationCall) (chargeonce.OperationResult, error) {
	params := &stripego.PaymentIntentCancelParams{CancellationReason: stripego.String(string(VoidReason))}
	params.SetIdempotencyKey(req.Reference)
	params.Context = ctx
	got, err := a.sc.V1PaymentIntents.Cancel(ctx, pi, params)
	if err != nil {
		return a.operationError(ctx, opVoid, req.Reference, pi, err)
	}
	return answered(opVoid, req.Reference, got)
}

// checkOperation refuses a call no acquirer could act on; the error
// matches chargeonce.ErrCaptureRejected (nothing was sent).
func checkOperation(req chargeonce.OperationCall, k opKind) error {
	var problem string
	switch {
	case req.Reference == "":
		problem = "the operation's reference is empty"
	case req.ChargeReference == "":
		problem = "the authorization's reference is empty"
	case k == opCapture && req.AmountCents <= 0:
		problem = fmt.Sprintf("amount_cents must be positive; got %d", req.AmountCents)
	default:
		return nil
	}
	return fmt.Errorf("%w: stripe: %s %s: %s", chargeonce.ErrCaptureRejected, k, req.Reference, problem)
}

// authorizationOf returns the id of the PaymentIntent that authorized
// req.ChargeReference (remembered, or found by Search), remembering it for
// the operation's lookups. None found is an unknown outcome with nothing
// sent: Search may lag behind an authorization another instance made.
func (a *Acquirer) authorizationOf(ctx context.Context, req chargeonce.OperationCall, k opKind) (string, error) {
	pi, reason, err := a.intentOf(ctx, req.ChargeReference)
	if err != nil {
		return "", fmt.Errorf("stripe: %s %s: %w; nothing was sent", k, req.Reference, err)
	}
	if pi == "" {
		return "", fmt.Errorf("stripe: %s %s: %s; nothing was sent", k, req.Reference, reason)
	}
	a.ops.put(req.Reference, pi)
	return pi, nil
}

// OperationError is an unknown outcome of a capture or a void (the request
// failed or its answer was lost). It names the PaymentIntent
// (chargeonce.AcquirerIDError): the engine records it, so that the lookups
// of the operation retrieve the PaymentIntent, on any instance, instead of
// searching for it.
type OperationError struct {
	Reference string
	// ID is the PaymentIntent's id.
	ID  string
	Err error
}

// Error implements error.
func (e *OperationError) Error() string { return e.Err.Error() }

// Unwrap returns what failed.
func (e *OperationError) Unwrap() error { return e.Err }

// AcquirerID implements chargeonce.AcquirerIDError.
func (e *OperationError) AcquirerID() string { return e.ID }

// operationError maps a failed capture or cancel of the PaymentIntent pi,
// as captureError maps a failed create: a card error is a definite failure
// with Stripe's decline_code; a refusal because the PaymentIntent no longer
// awaits capture is settled from the PaymentIntent Stripe sends along (or
// retrieves); another 4xx about the request is chargeonce.ErrCaptureRejected;
// network errors, timeouts, 5xx, 429, 409 and idempotency errors are
// unknown outcomes naming pi.
func (a *Acquirer) operationError(ctx context.Context, k opKind, reference, pi string, err error) (chargeonce.OperationResult, error) {
	cause := err // what stripe-go returned: its Retry-After, if any
	unknown := func(err error) error {
		return a.withRetryAfter(cause, &OperationError{Reference: reference, ID: pi, Err: err})
	}
	se, ok := errors.AsType[*stripego.Error](err)
	if !ok {
		return chargeonce.OperationResult{}, unknown(fmt.Errorf("stripe: %s %s on PaymentIntent %s: %w", k, reference, pi, err))
	}
	summary := fmt.Sprintf("stripe: %s %s on PaymentIntent %s: %d %s %s: %s (request %s)", k, reference, pi, se.HTTPStatusCode, se.Type, se.Code, se.Msg, se.RequestID)
	switch {
	case se.Type == stripego.ErrorTypeCard:
		return chargeonce.OperationResult{Reference: reference, Status: chargeonce.OperationFailed,
			FailureReason: cmp.Or(string(se.DeclineCode), string(se.Code), DeclineCardError)}, nil
	case se.Type == stripego.ErrorTypeIdempotency || !rejected(se.HTTPStatusCode):
		return chargeonce.OperationResult{}, unknown(errors.New(summary))
	case se.Code == stripego.ErrorCodePaymentIntentUnexpectedState:
		// The PaymentIntent is captured or canceled already: by this
		// operation (a re-send after Stripe forgot its key), or by
		// something else. Its state says which.
		got := se.PaymentIntent
		if got == nil || got.Status == "" {
			params := &stripego.PaymentIntentRetrieveParams{}
			params.Context = ctx
			if got, err = a.sc.V1PaymentIntents.Retrieve(ctx, pi, params); err != nil {
				return chargeonce.OperationResult{}, unknown(fmt.Errorf("%s; retrieving it: %w", summary, err))
			}
		}
		if lr := operationLookupOf(k, reference, got); lr.Status == chargeonce.LookupFound {
			return lr.Operation, nil
		}
	}
	return chargeonce.OperationResult{}, fmt.Errorf("%w: %s", chargeonce.ErrCaptureRejected, summary)
}

// answered maps Stripe's answer to a capture or a cancel: the
// PaymentIntent it left.
func answered(k opKind, reference string, pi *stripego.PaymentIntent) (chargeonce.OperationResult, error) {
	want := stripego.PaymentIntentStatusSucceeded
	if k == opVoid {
		want = stripego.PaymentIntentStatusCanceled
	}
	if pi.Status != want {
		return chargeonce.OperationResult{}, &OperationError{Reference: reference, ID: pi.ID,
			Err: fmt.Errorf("stripe: %s %s: PaymentIntent %s is %s: the outcome is not known yet", k, reference, pi.ID, pi.Status)}
	}
	return chargeonce.OperationResult{Reference: reference, Status: chargeonce.OperationSucceeded}, nil
}

// OperationLookup implements chargeonce.ManualCapturer as honestly as
// Lookup, from the one thing that is consistent at Stripe: the
// authorization's PaymentIntent, retrieved by id. A capture can only move
// money by taking that PaymentIntent out of requires_capture, and a void
// only by canceling it, so its status decides:
//
//   - requires_capture: nothing captured or voided it, so the operation
//     did not happen, and a re-send is safe (LookupSafeToSend): with the
//     Idempotency-Key still kept it replays the first answer, or finds a
//     first request still running (409, unknown); after that it is the
//     only capture or void the PaymentIntent will take;
//   - succeeded: a capture whose reference is in the metadata
//     (MetaCaptureReference, written by the capture itself) succeeded;
//     any other capture or void of it can only fail (LookupFound, failed);
//   - canceled: a void succeeded (the authorization is released, whoever
//     canceled it, and Stripe's cancellation_reason says who); a capture
//     failed;
//   - requires_payment_method, requires_confirmation, requires_action:
//     never authorized, so either failed;
//   - processing, or a state this adapter does not know: unsure.
//
// The PaymentIntent is the one req.AcquirerID names (the engine records
// the id an unknown outcome named), the one this adapter remembers for the
// reference, or the authorization of req.ChargeReference, found as
// CaptureAuthorized finds it; when Search finds none, the reference is safe
// to send only once it is older than SearchLag (no capture or void is ever
// sent without the PaymentIntent), else unsure. Without any of those, only
// a capture can be found (by searching its metadata); a void is unsure.
// The lookup cannot tell how much a capture took from its reference alone:
// its Reason says the PaymentIntent's amount_received.
func (a *Acquirer) OperationLookup(ctx context.Context, req chargeonce.LookupRequest) (chargeonce.LookupResult, error) {
	k, ok := kindOf(req.Reference)
	if !ok {
		return chargeonce.LookupResult{Reason: "reference " + req.Reference + " is neither a capture's (cp_) nor a void's (vd_)"}, nil
	}
	pi := cmp.Or(req.AcquirerID, a.ops.get(req.Reference))
	if pi == "" && req.ChargeReference != "" {
		id, reason, err := a.intentOf(ctx, req.ChargeReference)
		if err != nil {
			return chargeonce.LookupResult{}, err
		}
		if id == "" {
			return a.missing(req, reason)
		}
		pi = id
	}
	if pi == "" && k == opCapture {
		return a.searchCapture(ctx, req)
	}
	if pi == "" {
		if withinKeyWindow(req, a.opts.KeyWindow) {
			return chargeonce.LookupResult{Status: chargeonce.LookupSafeToSend, Reason: reasonKeyWindow}, nil
		}
		return chargeonce.LookupResult{Reason: "the authorization's PaymentIntent is not known (no id recorded, no charge reference), and a void leaves nothing to search for"}, nil
	}
	params := &stripego.PaymentIntentRetrieveParams{}
	params.Context = ctx
	got, err := a.sc.V1PaymentIntents.Retrieve(ctx, pi, params)
	if err != nil {
		return chargeonce.LookupResult{}, a.withRetryAfter(err, fmt.Errorf("stripe: retrieving PaymentIntent %s for %s: %w", pi, req.Reference, err))
	}
	if req.ChargeReference != "" && got.Metadata[MetaReference] != req.ChargeReference {
		return chargeonce.LookupResult{}, fmt.Errorf("stripe: PaymentIntent %s belongs to reference %q, not the authorization %s of %s",
			got.ID, got.Metadata[MetaReference], req.ChargeReference, req.Reference)
	}
	return operationLookupOf(k, req.Reference, got), nil
}

// reasonKeyWindow is why a re-send within KeyWindow is safe.
const reasonKeyWindow = "within Stripe's idempotency-key window: a re-send with the same key replays the first answer"

// withinKeyWindow reports a lookup that decides a re-send of a reference
// Stripe still holds the Idempotency-Key of. req.Age is the authorization's
// age, at least the operation's.
func withinKeyWindow(req chargeonce.LookupRequest, window time.Duration) bool {
	return req.Purpose == chargeonce.LookupToResend && req.AgeKnown && req.Age < window
}

// missing answers a lookup whose authorization's PaymentIntent Search did
// not find (reason says so). No capture or void is sent without it, so the
// operation is safe to send once its charge is older than the search lag
// (nothing can be there), or while Stripe keeps the key; else unsure,
// asking again once the lag is over.
func (a *Acquirer) missing(req chargeonce.LookupRequest, reason string) (chargeonce.LookupResult, error) {
	switch {
	case req.AgeKnown && req.Age >= a.opts.SearchLag:
		return chargeonce.LookupResult{Status: chargeonce.LookupSafeToSend,
			Reason: reason + ", and the charge is older than the search lag: no capture or void of it can have been sent"}, nil
	case withinKeyWindow(req, a.opts.KeyWindow):
		return chargeonce.LookupResult{Status: chargeonce.LookupSafeToSend, Reason: reasonKeyWindow}, nil
	}
	lr := chargeonce.LookupResult{Reason: reason}
	if req.AgeKnown {
		lr.RetryAfter = a.opts.SearchLag - req.Age
	}
	return lr, nil
}

// searchCapture looks for the PaymentIntent a capture wrote its reference
// on. Search is eventually consistent, so a miss is unsure; within the
// idempotency-key window a re-send is safe.
func (a *Acquirer) searchCapture(ctx context.Context, req chargeonce.LookupRequest) (chargeonce.LookupResult, error) {
	params := &stripego.PaymentIntentSearchParams{}
	params.Query = fmt.Sprintf("metadata['%s']:'%s'", MetaCaptureReference, quote(req.Reference))
	params.Context = ctx
	for pi, err := range a.sc.V1PaymentIntents.Search(ctx, params) {
		if err != nil {
			return chargeonce.LookupResult{}, a.withRetryAfter(err, fmt.Errorf("stripe: searching the PaymentIntent of capture %s: %w", req.Reference, err))
		}
		if pi.Metadata[MetaCaptureReference] == req.Reference {
			return operationLookupOf(opCapture, req.Reference, pi), nil
		}
	}
	if withinKeyWindow(req, a.opts.KeyWindow) {
		return chargeonce.LookupResult{Status: chargeonce.LookupSafeToSend, Reason: reasonKeyWindow}, nil
	}
	// A capture that failed writes nothing, and one that succeeded may be
	// missing from the index: nothing here is never "never seen".
	return chargeonce.LookupResult{Reason: "no PaymentIntent found carrying the capture's reference, and without the authorization's PaymentIntent a miss proves nothing"}, nil
}

// operationLookupOf says what the authorization's PaymentIntent tells about
// the capture or void with reference; see OperationLookup.
func operationLookupOf(k opKind, reference string, pi *stripego.PaymentIntent) chargeonce.LookupResult {
	lr := chargeonce.LookupResult{AcquirerID: pi.ID, Reason: fmt.Sprintf("PaymentIntent %s is %s", pi.ID, pi.Status)}
	found := func(status chargeonce.OperationStatus, failure string) chargeonce.LookupResult {
		lr.Status, lr.Binding = chargeonce.LookupFound, true
		lr.Operation = chargeonce.OperationResult{Reference: reference, Status: status, FailureReason: failure}
		return lr
	}
	switch pi.Status {
	case stripego.PaymentIntentStatusRequiresCapture:
		lr.Status = chargeonce.LookupSafeToSend
		lr.Reason += ": nothing captured or voided it"
		return lr
	case stripego.PaymentIntentStatusSucceeded:
		lr.Reason += fmt.Sprintf(" (amount_received %d, captured by %q)", pi.AmountReceived, pi.Metadata[MetaCaptureReference])
		if k == opCapture && pi.Metadata[MetaCaptureReference] == reference {
			return found(chargeonce.OperationSucceeded, "")
		}
		return found(chargeonce.OperationFailed, OperationFailedCaptured)
	case stripego.PaymentIntentStatusCanceled:
		lr.Reason += fmt.Sprintf(" (cancellation_reason %q)", pi.CancellationReason)
		if k == opVoid {
			return found(chargeonce.OperationSucceeded, "")
		}
		return found(chargeonce.OperationFailed, OperationFailedCanceled)
	case stripego.PaymentIntentStatusRequiresPaymentMethod, stripego.PaymentIntentStatusRequiresConfirmation,
		stripego.PaymentIntentStatusRequiresAction:
		// Never authorized: nothing to capture, nothing to void.
		return found(chargeonce.OperationFailed, OperationFailedNotOpen)
	}
	lr.Binding = true // processing: money may still move
	return lr
}
