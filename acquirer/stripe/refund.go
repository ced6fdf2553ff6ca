package stripe

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	stripego "github.com/stripe/stripe-go/v82"

	"github.com/chargeonce/chargeonce"
)

// Metadata keys of the Refunds the adapter creates, beside MetaReference
// (the refunded charge's reference) and MetaMerchant.
const (
	MetaRefundReference = "chargeonce_refund_reference"
)

// Failure reasons of refunds Stripe gives none for.
const (
	// RefundFailedUnknown: a failed or canceled Refund without a
	// failure_reason.
	RefundFailedUnknown = "unknown"
)

// maxKnownIntents bounds the PaymentIntents the adapter remembers from its
// own captures (see intents).
const maxKnownIntents = 4096

// intents remembers the PaymentIntent of each charge reference this
// adapter captured, so that a refund soon after the capture need not wait
// for Stripe's Search to index it. It is a cache only: a miss searches.
type intents struct {
	mu    sync.Mutex
	ids   map[string]string
	order []string
}

func (c *intents) get(ref string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ids[ref]
}

func (c *intents) put(ref, id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ids == nil {
		c.ids = map[string]string{}
	}
	if _, ok := c.ids[ref]; ok {
		c.ids[ref] = id
		return
	}
	if len(c.order) >= maxKnownIntents {
		delete(c.ids, c.order[0])
		c.order = c.order[1:]
	}
	c.ids[ref] = id
	c.order = append(c.order, ref)
}

var _ chargeonce.Refunder = (*Acquirer)(nil)

// Refund implements chargeonce.Refunder with Stripe's Refunds API: POST
// /v1/refunds on the PaymentIntent that captured req.ChargeReference, with
// the refund's reference as its Idempotency-Key and in its metadata.
//
// The PaymentIntent is the one this adapter captured (remembered) or, for
// an older charge, found by searching its reference. Search lags, so a
// PaymentIntent not found yet is an unknown outcome with nothing sent:
// recovery looks the refund up (safe to send, since nothing is there) and
// sends it again later.
//
// Stripe's succeeded, failed and canceled are definite; pending and
// requires_action are open (an unknown outcome naming the Refund, which
// later lookups retrieve). A 4xx about the request (more than remains
// refundable, a PaymentIntent that did not succeed) is a refusal,
// chargeonce.ErrCaptureRejected; network errors, 5xx, 429, 409 and
// idempotency errors are unknown outcomes.
func (a *Acquirer) Refund(ctx context.Context, req chargeonce.RefundCall) (chargeonce.RefundResult, error) {
	if req.AmountCents <= 0 {
		return chargeonce.RefundResult{}, fmt.Errorf("%w: stripe: refunding %s: amount_cents must be positive; got %d", chargeonce.ErrCaptureRejected, req.Reference, req.AmountCents)
	}
	amount, err := Amount(req.AmountCents, req.Currency)
	if err != nil {
		return chargeonce.RefundResult{}, fmt.Errorf("%w: stripe: refunding %s: %w", chargeonce.ErrCaptureRejected, req.Reference, err)
	}
	pi, reason, err := a.intentOf(ctx, req.ChargeReference)
	if err != nil {
		return chargeonce.RefundResult{}, err
	}
	if pi == "" {
		// Nothing was sent: the lookup of this refund finds nothing there.
		return chargeonce.RefundResult{}, fmt.Errorf("stripe: refunding %s: %s; nothing was sent", req.Reference, reason)
	}
	return a.refundIntent(ctx, pi, amount, req)
}

// refundIntent creates the Refund of req on the PaymentIntent pi, amount
// in Stripe's units.
func (a *Acquirer) refundIntent(ctx context.Context, pi string, amount int64, req chargeonce.RefundCall) (chargeonce.RefundResult, error) {
	params := &stripego.RefundCreateParams{
		PaymentIntent: stripego.String(pi),
		Amount:        stripego.Int64(amount),
	}
	params.SetIdempotencyKey(req.Reference)
	params.AddMetadata(MetaRefundReference, req.Reference)
	params.AddMetadata(MetaReference, req.ChargeReference)
	params.AddMetadata(MetaMerchant, req.Merchant)
	params.Context = ctx
	rf, err := a.sc.V1Refunds.Create(ctx, params)
	if err != nil {
		return chargeonce.RefundResult{}, a.withRetryAfter(err, refundError(req.Reference, err))
	}
	if req.Currency != "" && rf.Currency != "" && !strings.EqualFold(string(rf.Currency), req.Currency) {
		return chargeonce.RefundResult{}, fmt.Errorf("stripe: refunding %s: Refund %s is in %s, the charge in %s", req.Reference, rf.ID, rf.Currency, req.Currency)
	}
	res, settled := refundResult(req.Reference, rf)
	if !settled {
		return chargeonce.RefundResult{}, &OpenRefundError{Reference: req.Reference, ID: rf.ID, Status: rf.Status}
	}
	return res, nil
}

// OpenRefundError is a refund whose Stripe Refund is still open (pending,
// requires_action). Its id is recorded (chargeonce.AcquirerIDError), so
// that recovery retrieves the Refund until it settles.
type OpenRefundError struct {
	Reference string
	ID        string
	Status    stripego.RefundStatus
}

// Error implements error.
func (e *OpenRefundError) Error() string {
	return fmt.Sprintf("stripe: refunding %s: Refund %s is %s: the outcome is not known yet", e.Reference, e.ID, e.Status)
}

// AcquirerID implements chargeonce.AcquirerIDError.
func (e *OpenRefundError) AcquirerID() string { return e.ID }

// refundError maps a failed Refund create: a 4xx that describes the
// request is a refusal; the rest are unknown outcomes, as for captures.
func refundError(reference string, err error) error {
	se, ok := errors.AsType[*stripego.Error](err)
	if !ok {
		return fmt.Errorf("stripe: refunding %s: %w", reference, err)
	}
	summary := fmt.Sprintf("stripe: refunding %s: %d %s %s: %s (request %s)", reference, se.HTTPStatusCode, se.Type, se.Code, se.Msg, se.RequestID)
	if se.Type != stripego.ErrorTypeIdempotency && rejected(se.HTTPStatusCode) {
		return fmt.Errorf("%w: %s", chargeonce.ErrCaptureRejected, summary)
	}
	return errors.New(summary)
}

// refundResult maps a Refund to a settled result; settled is false while it
// is open.
func refundResult(reference string, rf *stripego.Refund) (res chargeonce.RefundResult, settled bool) {
	res = chargeonce.RefundResult{Reference: reference}
	switch rf.Status {
	case stripego.RefundStatusSucceeded:
		res.Status = chargeonce.RefundSucceeded
	case stripego.RefundStatusFailed:
		res.Status, res.FailureReason = chargeonce.RefundFailed, string(rf.FailureReason)
	case stripego.RefundStatusCanceled:
		res.Status, res.FailureReason = chargeonce.RefundCanceled, string(rf.FailureReason)
	default:
		return chargeonce.RefundResult{}, false
	}
	if res.Status != chargeonce.RefundSucceeded && res.FailureReason == "" {
		res.FailureReason = RefundFailedUnknown
	}
	return res, true
}

// intentOf returns the id of the PaymentIntent of the charge reference:
// remembered from this adapter's capture or authorization, or found by
// Search (a succeeded one first, else one that did not succeed, such as an
// authorization awaiting capture). An empty id says why none was found
// (Search may lag behind it).
func (a *Acquirer) intentOf(ctx context.Context, chargeRef string) (id, reason string, err error) {
	if id := a.known.get(chargeRef); id != "" {
		return id, "", nil
	}
	params := &stripego.PaymentIntentSearchParams{}
	params.Query = fmt.Sprintf("metadata['%s']:'%s'", MetaReference, quote(chargeRef))
	params.Context = ctx
	var open string
	for pi, err := range a.sc.V1PaymentIntents.Search(ctx, params) {
		if err != nil {
			return "", "", a.withRetryAfter(err, fmt.Errorf("stripe: searching the PaymentIntent of %s: %w", chargeRef, err))
		}
		if pi.Metadata[MetaReference] != chargeRef {
			continue
		}
		if pi.Status == stripego.PaymentIntentStatusSucceeded {
			a.known.put(chargeRef, pi.ID)
			return pi.ID, "", nil
		}
		open = pi.ID
	}
	if open != "" {
		// Stripe refuses the refund of a PaymentIntent that did not
		// succeed, and says why.
		return open, "", nil
	}
	return "", "no PaymentIntent of charge " + chargeRef + " found (Stripe's Search may lag behind it)", nil
}

// RefundLookup implements chargeonce.Refunder as honestly as Lookup.
//
// A refund whose Refund id is known (req.AcquirerID: an answer left it
// pending) is retrieved: settled, or unsure while it is open.
//
// Otherwise, to decide a re-send younger than KeyWindow, Stripe still holds
// the Idempotency-Key: LookupSafeToSend without a request. After that, and
// always for an operator, it lists the refunds of the charge's PaymentIntent
// (req.ChargeReference), which is consistent, unlike Search: a Refund whose
// metadata carries the reference settles it (or leaves it unsure while
// open); none is LookupSafeToSend. A PaymentIntent Search does not find yet
// is LookupSafeToSend only for a refund older than SearchLag (the charge is
// older still, so Search has it if it exists, and no refund could be made
// without it), else LookupUnsure.
func (a *Acquirer) RefundLookup(ctx context.Context, req chargeonce.LookupRequest) (chargeonce.LookupResult, error) {
	if req.AcquirerID != "" {
		return a.retrieveRefund(ctx, req)
	}
	if req.Purpose == chargeonce.LookupToResend && req.AgeKnown && req.Age < a.opts.KeyWindow {
		return chargeonce.LookupResult{Status: chargeonce.LookupSafeToSend,
			Reason: "within Stripe's idempotency-key window: a re-send with the same key replays the first answer"}, nil
	}
	if req.ChargeReference == "" {
		return chargeonce.LookupResult{Reason: "the refunded charge's reference is not known: Stripe's refunds are found through its PaymentIntent"}, nil
	}
	pi, reason, err := a.intentOf(ctx, req.ChargeReference)
	if err != nil {
		return chargeonce.LookupResult{}, err
	}
	if pi == "" {
		if req.AgeKnown && req.Age >= a.opts.SearchLag {
			return chargeonce.LookupResult{Status: chargeonce.LookupSafeToSend,
				Reason: reason + ", and the refund is older than the search lag: no Refund can exist"}, nil
		}
		lr := chargeonce.LookupResult{Reason: reason}
		if req.AgeKnown {
			lr.RetryAfter = a.opts.SearchLag - req.Age
		}
		return lr, nil
	}
	return a.refundOn(ctx, pi, req.Reference)
}

// refundOn looks for the Refund of reference among the refunds of the
// PaymentIntent pi: Stripe's list, unlike its Search, is consistent, so
// none there is LookupSafeToSend.
func (a *Acquirer) refundOn(ctx context.Context, pi, reference string) (chargeonce.LookupResult, error) {
	params := &stripego.RefundListParams{PaymentIntent: stripego.String(pi)}
	params.Limit = stripego.Int64(100)
	params.Context = ctx
	var open *chargeonce.LookupResult
	for rf, err := range a.sc.V1Refunds.List(ctx, params) {
		if err != nil {
			return chargeonce.LookupResult{}, a.withRetryAfter(err, fmt.Errorf("stripe: listing the refunds of PaymentIntent %s for %s: %w", pi, reference, err))
		}
		if rf.Metadata[MetaRefundReference] != reference {
			continue
		}
		lr := refundLookupOf(reference, rf)
		if lr.Status == chargeonce.LookupFound {
			return lr, nil
		}
		open = &lr
	}
	if open != nil {
		return *open, nil
	}
	return chargeonce.LookupResult{Status: chargeonce.LookupSafeToSend,
		Reason: "PaymentIntent " + pi + " has no Refund with the reference"}, nil
}

// retrieveRefund answers a lookup from the Refund whose id was recorded.
func (a *Acquirer) retrieveRefund(ctx context.Context, req chargeonce.LookupRequest) (chargeonce.LookupResult, error) {
	params := &stripego.RefundRetrieveParams{}
	params.Context = ctx
	rf, err := a.sc.V1Refunds.Retrieve(ctx, req.AcquirerID, params)
	if err != nil {
		return chargeonce.LookupResult{}, a.withRetryAfter(err, fmt.Errorf("stripe: retrieving Refund %s of %s: %w", req.AcquirerID, req.Reference, err))
	}
	if ref := rf.Metadata[MetaRefundReference]; ref != req.Reference {
		return chargeonce.LookupResult{}, fmt.Errorf("stripe: Refund %s belongs to reference %q, not %s", rf.ID, ref, req.Reference)
	}
	return refundLookupOf(req.Reference, rf), nil
}

// refundLookupOf says what one Refund tells about its reference: settled,
// or unsure while open, naming it so that recovery retrieves it.
func refundLookupOf(reference string, rf *stripego.Refund) chargeonce.LookupResult {
	lr := chargeonce.LookupResult{AcquirerID: rf.ID, Reason: fmt.Sprintf("Refund %s is %s", rf.ID, rf.Status)}
	if res, settled := refundResult(reference, rf); settled {
		lr.Status, lr.Refund = chargeonce.LookupFound, res
	}
	// Money moved, or may still move: nobody may call it failed.
	lr.Binding = rf.Status != stripego.RefundStatusFailed && rf.Status != stripego.RefundStatusCanceled
	return lr
}
