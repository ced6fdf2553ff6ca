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

// Failure reasons of the simulator's captures and voids of authorizations
// that moved nothing.
const (
	OperationFailedUnknownAuthorization = "unknown_authorization"
	OperationFailedNotAuthorized        = "authorization_not_open"
	OperationFailedExceeds              = "amount_exceeds_authorized"
)

// Operation is the simulator's record of one capture or void of an
// authorization that settled.
type Operation struct {
	Reference       string                     `json:"reference"`
	Kind            chargeonce.LedgerKind      `json:"kind"`
	ChargeReference string                     `json:"charge_reference"`
	Merchant        string                     `json:"merchant"`
	AmountCents     int64                      `json:"amount_cents"`
	Currency        string                     `json:"currency"`
	Status          chargeonce.OperationStatus `json:"status"`
	FailureReason   string                     `json:"failure_reason,omitempty"`
	CreatedAt       time.Time                  `json:"created_at"`
}

// Result returns the answer a request for o's reference gets.
func (o *Operation) Result() chargeonce.OperationResult {
	return chargeonce.OperationResult{Reference: o.Reference, Status: o.Status, FailureReason: o.FailureReason}
}

// opRef is the simulator's state for one operation reference.
type opRef struct {
	runs int
	op   *Operation
	// fenced: Fence was called before anything settled.
	fenced bool
}

var _ chargeonce.ManualCapturer = (*Simulator)(nil)

// Authorize holds req's amount without capturing it, idempotently by
// req.Reference, with Capture's fault tokens and answers: a nil error is
// authorized or declined. Only a capture (CaptureAuthorized) moves the
// money; a void (Void) releases it.
func (s *Simulator) Authorize(ctx context.Context, req chargeonce.CaptureRequest) (chargeonce.CaptureResult, error) {
	return s.capture(ctx, req, true)
}

// CaptureAuthorized captures req.AmountCents (at most the authorized
// amount) of the authorization req.ChargeReference, idempotently by
// req.Reference; see operate.
func (s *Simulator) CaptureAuthorized(ctx context.Context, req chargeonce.OperationCall) (chargeonce.OperationResult, error) {
	return s.operate(ctx, req, chargeonce.LedgerCapture, time.Now())
}

// Void releases the authorization req.ChargeReference, idempotently by
// req.Reference; see operate.
func (s *Simulator) Void(ctx context.Context, req chargeonce.OperationCall) (chargeonce.OperationResult, error) {
	return s.operate(ctx, req, chargeonce.LedgerVoid, time.Now())
}

// operate captures or voids an authorization, for a request sent at
// sent: it lands after its delay whether or not the caller still waits
// (see send), unless its reference is fenced or it lands past the
// acceptance window. A repeated reference returns
// the first result and moves nothing. It follows the authorization's
// payment token, as refunds do: after tok_fail_before the first request
// answers ErrUnavailable and settles nothing, after tok_fail_after it
// settles and then answers ErrUnavailable (the reply is lost), and
// tok_slow delays the first request by --slow; later requests behave as
// tok_ok. An authorization settles once: a capture or void of one that is
// unknown, declined, already captured or voided, or a capture past its
// amount, fails (a definite answer; nothing moves).
func (s *Simulator) operate(ctx context.Context, req chargeonce.OperationCall, kind chargeonce.LedgerKind, sent time.Time) (chargeonce.OperationResult, error) {
	if err := ValidateOperationCall(req); err != nil {
		return chargeonce.OperationResult{}, err
	}
	delay := s.opts.Latency
	s.mu.Lock()
	if auth := s.refs[req.ChargeReference]; auth != nil && auth.token == TokenSlow {
		if or := s.ops[req.Reference]; or == nil || or.runs == 0 {
			delay += s.opts.Slow
		}
	}
	s.mu.Unlock()
	return send(ctx, s, delay, func() (chargeonce.OperationResult, error) { return s.landOperation(req, kind, sent) })
}

// landOperation settles a capture or void request that reached the
// simulator.
func (s *Simulator) landOperation(req chargeonce.OperationCall, kind chargeonce.LedgerKind, sent time.Time) (chargeonce.OperationResult, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stats.OperationRequests++
	or := s.ops[req.Reference]
	if or == nil {
		or = &opRef{}
		s.ops[req.Reference] = or
	}
	if or.op != nil {
		s.stats.DuplicateOperationRequests++
		return or.op.Result(), nil
	}
	if err := s.refuseLate(req.Reference, or.fenced, sent); err != nil {
		return chargeonce.OperationResult{}, err
	}
	or.runs++
	auth := s.refs[req.ChargeReference]
	token := TokenOK
	if auth != nil && or.runs == 1 {
		token = auth.token
	}
	if token == TokenFailBefore {
		return chargeonce.OperationResult{}, fmt.Errorf("%w: %s: nothing settled for reference %s", ErrUnavailable, TokenFailBefore, req.Reference)
	}
	op := &Operation{
		Reference: req.Reference, Kind: kind, ChargeReference: req.ChargeReference, Merchant: req.Merchant,
		AmountCents: req.AmountCents, Currency: req.Currency, Status: chargeonce.OperationSucceeded, CreatedAt: time.Now().UTC(),
	}
	switch {
	case auth == nil || auth.first == nil:
		op.Status, op.FailureReason = chargeonce.OperationFailed, OperationFailedUnknownAuthorization
	case auth.first.Status != chargeonce.StatusAuthorized || auth.settledBy != "":
		op.Status, op.FailureReason = chargeonce.OperationFailed, OperationFailedNotAuthorized
	case kind == chargeonce.LedgerCapture && req.AmountCents > auth.first.AmountCents:
		op.Status, op.FailureReason = chargeonce.OperationFailed, OperationFailedExceeds
	case kind == chargeonce.LedgerCapture:
		auth.settledBy, auth.captured = req.Reference, req.AmountCents
		s.stats.AuthorizationCaptures++
		// The ledger lists the capture under the charge's reference, for
		// the captured amount, with the operation's reference.
		s.ledger.addOperation(op, auth.first)
	default:
		auth.settledBy, auth.voided = req.Reference, true
		op.AmountCents = auth.first.AmountCents
		s.stats.Voids++
		s.ledger.addOperation(op, auth.first)
	}
	or.op = op
	if token == TokenFailAfter {
		return chargeonce.OperationResult{}, fmt.Errorf("%w: %s: %s %s settled, reply lost", ErrUnavailable, TokenFailAfter, kind, req.Reference)
	}
	return op.Result(), nil
}

// OperationLookup implements chargeonce.ManualCapturer: LookupFound with
// the settled capture or void, or LookupSafeToSend when none settled under
// the reference (the simulator never forgets one). It moves nothing.
func (s *Simulator) OperationLookup(ctx context.Context, req chargeonce.LookupRequest) (chargeonce.LookupResult, error) {
	if err := ctx.Err(); err != nil {
		return chargeonce.LookupResult{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if or := s.ops[req.Reference]; or != nil && or.op != nil {
		return chargeonce.LookupResult{Status: chargeonce.LookupFound, Operation: or.op.Result()}, nil
	}
	return chargeonce.LookupResult{Status: chargeonce.LookupSafeToSend, Reason: "no capture or void settled under the reference"}, nil
}

// GetOperation returns the settled capture or void with reference.
func (s *Simulator) GetOperation(reference string) (Operation, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if or := s.ops[reference]; or != nil && or.op != nil {
		return *or.op, true
	}
	return Operation{}, false
}

// Authorization tells what became of the authorization with
// chargeReference: the captured amount, and whether it was voided. A test
// asserts "captured once, or voided, never both" with it.
func (s *Simulator) Authorization(chargeReference string) (captured int64, voided bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ref := s.refs[chargeReference]; ref != nil {
		return ref.captured, ref.voided
	}
	return 0, false
}

// ValidateOperationCall checks req's fields. Errors are chargeonce.EINVALID,
// name the field, and match chargeonce.ErrCaptureRejected (nothing moves).
func ValidateOperationCall(req chargeonce.OperationCall) error {
	return ValidateRefundCall(chargeonce.RefundCall(req))
}

// authorize serves POST /v1/authorizations, Capture's twin: the body and
// header of POST /v1/captures, 200 {"reference","status","decline_code"}
// with status authorized or declined.
func (h *handler) authorize(w http.ResponseWriter, r *http.Request) {
	req, err := decodeCaptureRequest(w, r)
	if err != nil {
		writeError(w, err)
		return
	}
	if err := h.sim.arrivedLate(req.Reference, sentAt(r)); err != nil {
		writeError(w, err)
		return
	}
	res, err := h.sim.Authorize(r.Context(), req)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, captureResponse{Reference: res.Reference, Status: res.Status, DeclineCode: nullable(res.DeclineCode)})
}

// operation serves POST /v1/authorizations/capture and
// /v1/authorizations/void with header Idempotency-Key: <reference> and
// body {"reference","charge_reference","merchant","amount_cents",
// "currency"}: 200 {"reference","status","failure_reason"}; a repeated
// reference answers the first result and moves nothing.
func (h *handler) operation(kind chargeonce.LedgerKind) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req chargeonce.OperationCall
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
		res, err := h.sim.operate(r.Context(), req, kind, sentAt(r))
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, res)
	}
}

// getOperation serves GET /v1/operations/{reference}: the settled capture
// or void, or 404.
func (h *handler) getOperation(w http.ResponseWriter, r *http.Request) {
	ref := r.PathValue("reference")
	op, ok := h.sim.GetOperation(ref)
	if !ok {
		writeError(w, chargeonce.Errorf(chargeonce.ENOTFOUND, "no capture or void for reference %q", ref))
		return
	}
	writeJSON(w, http.StatusOK, op)
}

var _ chargeonce.ManualCapturer = (*Client)(nil)

// Authorize implements chargeonce.ManualCapturer over the simulator's HTTP
// API (POST /v1/authorizations), with Capture's outcome classes.
func (c *Client) Authorize(ctx context.Context, req chargeonce.CaptureRequest) (chargeonce.CaptureResult, error) {
	var resp captureResponse
	if err := c.post(ctx, "/v1/authorizations", req.Reference, req, &resp); err != nil {
		return chargeonce.CaptureResult{}, fmt.Errorf("acquirer: authorizing %s: %w", req.Reference, err)
	}
	res := chargeonce.CaptureResult{Reference: resp.Reference, Status: resp.Status}
	if resp.DeclineCode != nil {
		res.DeclineCode = *resp.DeclineCode
	}
	switch {
	case res.Reference != req.Reference:
		return chargeonce.CaptureResult{}, fmt.Errorf("acquirer: authorizing %s: the answer is for reference %q", req.Reference, res.Reference)
	case res.Status == chargeonce.StatusAuthorized && res.DeclineCode == "":
	case res.Status == chargeonce.StatusDeclined:
	default:
		return chargeonce.CaptureResult{}, fmt.Errorf("acquirer: authorizing %s: unexpected answer: status %q, decline_code %q", req.Reference, res.Status, res.DeclineCode)
	}
	return res, nil
}

// CaptureAuthorized implements chargeonce.ManualCapturer with POST
// /v1/authorizations/capture.
func (c *Client) CaptureAuthorized(ctx context.Context, req chargeonce.OperationCall) (chargeonce.OperationResult, error) {
	return c.operation(ctx, req, "capture")
}

// Void implements chargeonce.ManualCapturer with POST
// /v1/authorizations/void.
func (c *Client) Void(ctx context.Context, req chargeonce.OperationCall) (chargeonce.OperationResult, error) {
	return c.operation(ctx, req, "void")
}

func (c *Client) operation(ctx context.Context, req chargeonce.OperationCall, verb string) (chargeonce.OperationResult, error) {
	var res chargeonce.OperationResult
	if err := c.post(ctx, "/v1/authorizations/"+verb, req.Reference, req, &res); err != nil {
		return chargeonce.OperationResult{}, fmt.Errorf("acquirer: %s %s: %w", verb, req.Reference, err)
	}
	if res.Reference != req.Reference || !res.Status.Final() {
		return chargeonce.OperationResult{}, fmt.Errorf("acquirer: %s %s: unexpected answer: reference %q, status %q", verb, req.Reference, res.Reference, res.Status)
	}
	return res, nil
}

// OperationLookup implements chargeonce.ManualCapturer with GET
// /v1/operations/{reference}, read as RefundLookup reads refunds: found
// on 200, safe to send on the simulator's own not-found problem, unsure on
// a bare 404.
func (c *Client) OperationLookup(ctx context.Context, req chargeonce.LookupRequest) (chargeonce.LookupResult, error) {
	hreq, err := c.newGet(ctx, "/v1/operations/"+url.PathEscape(req.Reference))
	if err != nil {
		return chargeonce.LookupResult{}, err
	}
	var op Operation
	err = c.do(hreq, &op)
	if se, ok := errors.AsType[*StatusError](err); ok && se.StatusCode == http.StatusNotFound {
		if se.Problem.Type == chargeonce.ProblemTypeBase+chargeonce.ENOTFOUND {
			return chargeonce.LookupResult{Status: chargeonce.LookupSafeToSend, Reason: "the acquirer holds no capture or void under the reference"}, nil
		}
		return chargeonce.LookupResult{Reason: "a 404 without the acquirer's not-found problem details (a proxy, or a wrong URL?)"}, nil
	}
	if err != nil {
		return chargeonce.LookupResult{}, fmt.Errorf("acquirer: looking up operation %s: %w", req.Reference, err)
	}
	if op.Reference != req.Reference || !op.Status.Final() {
		return chargeonce.LookupResult{}, fmt.Errorf("acquirer: looking up operation %s: unexpected answer: reference %q, status %q", req.Reference, op.Reference, op.Status)
	}
	return chargeonce.LookupResult{Status: chargeonce.LookupFound, Operation: op.Result()}, nil
}
