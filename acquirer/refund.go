package acquirer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/chargeonce/chargeonce"
)

// Failure reasons of the simulator's refunds that moved no money.
const (
	RefundFailedUnknownCapture = "unknown_capture"
	RefundFailedNotCaptured    = "capture_not_captured"
	RefundFailedExceeds        = "amount_exceeds_captured"
)

// Refund is the simulator's record of one refund reference that settled.
type Refund struct {
	Reference       string                  `json:"reference"`
	ChargeReference string                  `json:"charge_reference"`
	Merchant        string                  `json:"merchant"`
	AmountCents     int64                   `json:"amount_cents"`
	Currency        string                  `json:"currency"`
	Status          chargeonce.RefundStatus `json:"status"`
	FailureReason   string                  `json:"failure_reason,omitempty"`
	CreatedAt       time.Time               `json:"created_at"`
}

// Result returns the answer a refund request for r's reference gets.
func (r *Refund) Result() chargeonce.RefundResult {
	return chargeonce.RefundResult{Reference: r.Reference, Status: r.Status, FailureReason: r.FailureReason}
}

// refundRef is the simulator's state for one refund reference: requests
// seen, and the refund once settled.
type refundRef struct {
	runs   int
	refund *Refund
	// fenced: Fence was called before anything settled; every later
	// request for the reference is refused.
	fenced bool
}

var _ chargeonce.Refunder = (*Simulator)(nil)

// Refund moves money back for a settled capture, idempotently by
// req.Reference: a repeated reference returns the first result and moves
// nothing. It follows the refunded capture's payment token: after
// tok_fail_before the first request for the refund answers
// ErrUnavailable and refunds nothing, after tok_fail_after it refunds and
// then answers ErrUnavailable (the reply is lost), and tok_slow delays the
// first request by --slow; later requests behave as tok_ok. A refund of a
// reference that never captured, or of more than the capture has left,
// fails (a definite answer, nothing moves). The request lands after
// --latency whether or not the caller still waits (see send), unless its
// reference is fenced or it lands past the acceptance window.
func (s *Simulator) Refund(ctx context.Context, req chargeonce.RefundCall) (chargeonce.RefundResult, error) {
	return s.refund(ctx, req, time.Now())
}

// refund is Refund for a request sent at sent.
func (s *Simulator) refund(ctx context.Context, req chargeonce.RefundCall, sent time.Time) (chargeonce.RefundResult, error) {
	if err := ValidateRefundCall(req); err != nil {
		return chargeonce.RefundResult{}, err
	}
	s.mu.Lock()
	delay := s.opts.Latency
	if capture := s.refs[req.ChargeReference]; capture != nil && capture.token == TokenSlow {
		if rr := s.refunds[req.Reference]; rr == nil || rr.runs == 0 {
			delay += s.opts.Slow
		}
	}
	s.mu.Unlock()
	return send(ctx, s, delay, func() (chargeonce.RefundResult, error) { return s.landRefund(req, sent) })
}

// landRefund settles a refund request that reached the simulator.
func (s *Simulator) landRefund(req chargeonce.RefundCall, sent time.Time) (chargeonce.RefundResult, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stats.RefundRequests++
	rr := s.refunds[req.Reference]
	if rr == nil {
		rr = &refundRef{}
		s.refunds[req.Reference] = rr
	}
	if rr.refund != nil {
		s.stats.DuplicateRefundRequests++
		return rr.refund.Result(), nil
	}
	if err := s.refuseLate(req.Reference, rr.fenced, sent); err != nil {
		return chargeonce.RefundResult{}, err
	}
	rr.runs++
	capture := s.refs[req.ChargeReference]
	token := TokenOK
	if capture != nil && rr.runs == 1 {
		token = capture.token
	}
	if token == TokenFailBefore {
		return chargeonce.RefundResult{}, fmt.Errorf("%w: %s: nothing refunded for reference %s", ErrUnavailable, TokenFailBefore, req.Reference)
	}
	r := &Refund{
		Reference: req.Reference, ChargeReference: req.ChargeReference, Merchant: req.Merchant,
		AmountCents: req.AmountCents, Currency: req.Currency, Status: chargeonce.RefundSucceeded, CreatedAt: time.Now().UTC(),
	}
	switch {
	case capture == nil || capture.first == nil:
		r.Status, r.FailureReason = chargeonce.RefundFailed, RefundFailedUnknownCapture
	case capture.capturedCents() == 0:
		r.Status, r.FailureReason = chargeonce.RefundFailed, RefundFailedNotCaptured
	case capture.refunded+req.AmountCents > capture.capturedCents():
		r.Status, r.FailureReason = chargeonce.RefundFailed, RefundFailedExceeds
	default:
		capture.refunded += req.AmountCents
		s.stats.Refunds++
	}
	rr.refund = r
	s.ledger.add(chargeonce.LedgerEntry{
		Kind: chargeonce.LedgerRefund, Reference: r.Reference, ChargeReference: r.ChargeReference,
		Merchant: r.Merchant, AmountCents: r.AmountCents, Currency: r.Currency,
		Status: string(r.Status), CreatedAt: r.CreatedAt,
	})
	if token == TokenFailAfter {
		return chargeonce.RefundResult{}, fmt.Errorf("%w: %s: refund %s settled, reply lost", ErrUnavailable, TokenFailAfter, req.Reference)
	}
	return r.Result(), nil
}

// RefundLookup implements chargeonce.Refunder: LookupFound with the
// settled refund, or LookupSafeToSend when no refund settled under the
// reference (the simulator never forgets one). It moves nothing.
func (s *Simulator) RefundLookup(ctx context.Context, req chargeonce.LookupRequest) (chargeonce.LookupResult, error) {
	if err := ctx.Err(); err != nil {
		return chargeonce.LookupResult{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if rr := s.refunds[req.Reference]; rr != nil && rr.refund != nil {
		return chargeonce.LookupResult{Status: chargeonce.LookupFound, Refund: rr.refund.Result()}, nil
	}
	return chargeonce.LookupResult{Status: chargeonce.LookupSafeToSend, Reason: "no refund settled under the reference"}, nil
}

// GetRefund returns the settled refund with reference.
func (s *Simulator) GetRefund(reference string) (Refund, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if rr := s.refunds[reference]; rr != nil && rr.refund != nil {
		return *rr.refund, true
	}
	return Refund{}, false
}

// RefundedCents returns how much the capture with chargeReference had
// refunded: a test asserts "never more than captured" with it.
func (s *Simulator) RefundedCents(chargeReference string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ref := s.refs[chargeReference]; ref != nil {
		return ref.refunded
	}
	return 0
}

// ValidateRefundCall checks req's fields. Errors are chargeonce.EINVALID,
// name the field, and match chargeonce.ErrCaptureRejected (nothing moves).
func ValidateRefundCall(req chargeonce.RefundCall) error {
	var err error
	switch {
	case !visibleASCII(req.Reference, MaxReferenceLen):
		err = chargeonce.FieldError("reference", "reference must be 1 to %d visible ASCII characters", MaxReferenceLen)
	case !visibleASCII(req.ChargeReference, MaxReferenceLen):
		err = chargeonce.FieldError("charge_reference", "charge_reference must be 1 to %d visible ASCII characters", MaxReferenceLen)
	case req.Merchant == "" || len(req.Merchant) > MaxMerchantLen:
		err = chargeonce.FieldError("merchant", "merchant must be 1 to %d bytes", MaxMerchantLen)
	case req.AmountCents <= 0:
		err = chargeonce.FieldError("amount_cents", "amount_cents must be a positive 64-bit integer")
	case !upperCode(req.Currency):
		err = chargeonce.FieldError("currency", "currency must be an upper-case ISO 4217 code such as BRL; got %q", req.Currency)
	}
	if err != nil {
		return fmt.Errorf("%w: %w", chargeonce.ErrCaptureRejected, err)
	}
	return nil
}

// refund serves POST /v1/refunds with header Idempotency-Key: <reference>
// and body {"reference","charge_reference","merchant","amount_cents",
// "currency"}: 200 {"reference","status","failure_reason"}; a repeated
// reference answers the first result and moves nothing.
func (h *handler) refund(w http.ResponseWriter, r *http.Request) {
	var req chargeonce.RefundCall
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		writeError(w, decodeError(err))
		return
	}
	if vals := r.Header.Values("Idempotency-Key"); len(vals) > 0 {
		key, err := parseReferenceHeader(vals)
		if err != nil {
			writeError(w, err)
			return
		}
		if req.Reference == "" {
			req.Reference = key
		}
		if req.Reference != key {
			writeError(w, chargeonce.FieldError("reference", "reference %q does not match the Idempotency-Key header %q", req.Reference, key))
			return
		}
	}
	res, err := h.sim.refund(r.Context(), req, sentAt(r))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}

// getRefund serves GET /v1/refunds/{reference}: the settled refund, or 404.
func (h *handler) getRefund(w http.ResponseWriter, r *http.Request) {
	ref := r.PathValue("reference")
	rf, ok := h.sim.GetRefund(ref)
	if !ok {
		writeError(w, chargeonce.Errorf(chargeonce.ENOTFOUND, "no refund for reference %q", ref))
		return
	}
	writeJSON(w, http.StatusOK, rf)
}

var _ chargeonce.Refunder = (*Client)(nil)

// Refund implements chargeonce.Refunder over the simulator's HTTP API (POST
// /v1/refunds), with the outcome classes of Capture.
func (c *Client) Refund(ctx context.Context, req chargeonce.RefundCall) (chargeonce.RefundResult, error) {
	var res chargeonce.RefundResult
	if err := c.post(ctx, "/v1/refunds", req.Reference, req, &res); err != nil {
		return chargeonce.RefundResult{}, fmt.Errorf("acquirer: refunding %s: %w", req.Reference, err)
	}
	if res.Reference != req.Reference || !res.Status.Final() {
		return chargeonce.RefundResult{}, fmt.Errorf("acquirer: refunding %s: unexpected answer: reference %q, status %q", req.Reference, res.Reference, res.Status)
	}
	return res, nil
}

// RefundLookup implements chargeonce.Refunder with GET
// /v1/refunds/{reference}, read as Lookup reads captures: found on 200,
// safe to send on the simulator's own not-found problem, unsure on a bare
// 404.
func (c *Client) RefundLookup(ctx context.Context, req chargeonce.LookupRequest) (chargeonce.LookupResult, error) {
	hreq, err := c.newGet(ctx, "/v1/refunds/"+url.PathEscape(req.Reference))
	if err != nil {
		return chargeonce.LookupResult{}, err
	}
	var rf Refund
	err = c.do(hreq, &rf)
	if se, ok := errors.AsType[*StatusError](err); ok && se.StatusCode == http.StatusNotFound {
		if se.Problem.Type == chargeonce.ProblemTypeBase+chargeonce.ENOTFOUND {
			return chargeonce.LookupResult{Status: chargeonce.LookupSafeToSend, Reason: "the acquirer holds no refund under the reference"}, nil
		}
		return chargeonce.LookupResult{Reason: "a 404 without the acquirer's not-found problem details (a proxy, or a wrong URL?)"}, nil
	}
	if err != nil {
		return chargeonce.LookupResult{}, fmt.Errorf("acquirer: looking up refund %s: %w", req.Reference, err)
	}
	if rf.Reference != req.Reference || !rf.Status.Final() {
		return chargeonce.LookupResult{}, fmt.Errorf("acquirer: looking up refund %s: unexpected answer: reference %q, status %q", req.Reference, rf.Reference, rf.Status)
	}
	return chargeonce.LookupResult{Status: chargeonce.LookupFound, Refund: rf.Result()}, nil
}
