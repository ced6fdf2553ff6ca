package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/idempotency"
)

// Capture runs one attempt of a capture of the merchant's authorized
// charge chargeID (amountCents of it; zero: all of it), identified by
// (merchant, key), with the charge protocol; see operate.
func (e *Engine) Capture(ctx context.Context, merchantID, chargeID, key string, req *chargeonce.CaptureBody) (Response, error) {
	return e.operate(ctx, merchantID, chargeID, key, chargeonce.KindCapture, req.AmountCents, false)
}

// Cancel runs one attempt of a cancel (void) of the merchant's authorized
// charge chargeID, identified by (merchant, key); see operate.
func (e *Engine) Cancel(ctx context.Context, merchantID, chargeID, key string) (Response, error) {
	return e.operate(ctx, merchantID, chargeID, key, chargeonce.KindCancel, 0, false)
}

// ExpiryKeyPrefix prefixes the Idempotency-Key under which the sweeper
// cancels an expired authorization (chargeonce.ExpiryKeyPrefix).
const ExpiryKeyPrefix = chargeonce.ExpiryKeyPrefix

// CancelExpired cancels an authorization past its time to live, for the
// sweeper, with the protocol of Cancel under the key ExpiryKeyPrefix +
// the charge's id, outside the merchant's rate, and says what became of
// it: a stored answer replayed is ExpiryAnswered (this attempt did
// nothing), a 402 ExpiryFailed, a 202 ExpiryPending (left to recovery).
// The errors are operate's (ENOTAUTHORIZED when a capture or cancel holds
// the charge, or it is no longer authorized; EINPROGRESS while another
// attempt holds the key).
func (e *Engine) CancelExpired(ctx context.Context, a chargeonce.ExpiredAuthorization) (chargeonce.ExpiryOutcome, error) {
	resp, err := e.operate(ctx, a.MerchantID, a.ChargeID, ExpiryKeyPrefix+a.ChargeID, chargeonce.KindCancel, 0, true)
	switch {
	case err != nil:
		return "", err
	case resp.Replayed:
		return chargeonce.ExpiryAnswered, nil
	case resp.Status == 200:
		return chargeonce.ExpiryCanceled, nil
	case resp.Status == 402:
		return chargeonce.ExpiryFailed, nil
	}
	return chargeonce.ExpiryPending, nil
}

// operate runs one attempt of a capture or a cancel with the charge
// protocol: the operation's record is inserted and committed first (the
// store refuses, with nothing written, an operation of a charge that is
// not authorized or already held by another capture or cancel, and a
// capture past the authorized amount), then the acquirer is called with
// the operation's own reference, and the final answer is stored with a
// compare-and-set on the attempt's token and replayed to every retry; 409
// while another attempt holds the lease, 422 for a key used for another
// request.
//
// The answer is 200 with the charge once the acquirer settled the
// operation (captured, or canceled), a 402 problem when the acquirer
// refused it (the charge stays authorized), and 202 with the charge still
// authorized while the outcome is unknown; recovery, or a retry once the
// back-off is over, looks the reference up before re-sending it. internal
// (the sweeper) skips the merchant's rate (beforeWork).
func (e *Engine) operate(ctx context.Context, merchantID, chargeID, key string, kind chargeonce.RecordKind, amount int64, internal bool) (Response, error) {
	if err := ctx.Err(); err != nil {
		return Response{}, abandoned(err)
	}
	if _, ok := e.acquirer.(chargeonce.ManualCapturer); !ok {
		return Response{}, chargeonce.Errorf(chargeonce.EINVALID, "this service's acquirer cannot capture or cancel authorizations; nothing was kept for this Idempotency-Key")
	}
	fp := idempotency.OperationFingerprint(kind, chargeID, amount)
	if !internal {
		if resp, done, err := e.beforeWork(ctx, merchantID, key, fp); done {
			return resp, err
		}
	}
	client := ctx
	token := idempotency.NewToken()
	ctx, cancel := e.detach(ctx)
	defer cancel()
	rec, inserted, err := e.store.OperationInsert(ctx, chargeonce.OperationInsertParams{
		Fingerprint: fp,
		Token:       token,
		Lease:       e.opts.Lease,
		Operation: chargeonce.Operation{
			ID:             idempotency.NewOperationID(kind),
			Kind:           kind,
			MerchantID:     merchantID,
			IdempotencyKey: key,
			ChargeID:       chargeID,
			AmountCents:    amount,
		},
	})
	if err != nil {
		switch chargeonce.ErrorCode(err) {
		case chargeonce.ENOTFOUND, chargeonce.ENOTAUTHORIZED, chargeonce.ECAPTUREEXCEEDS, chargeonce.EINVALID:
			return Response{}, err // refused: nothing written
		}
		// The insert may have committed. Nothing is released: an
		// operation once inserted holds its charge and is driven by the
		// retry, once its lease ends, or by recovery.
		return Response{}, fmt.Errorf("%w: beginning %s: %w", chargeonce.Errorf(chargeonce.EUNAVAILABLE,
			"the outcome is unknown; retry with the same Idempotency-Key"), kind, err)
	}
	if inserted {
		done, err := e.admit(client, merchantID)
		if err != nil {
			// Without a slot the operation, committed, is not released
			// (it holds the charge): recovery drives it at once, and the
			// answer says it is pending.
			e.handOff(ctx, rec.ObjectID(), merchantID, key, token, 0, false)
			return Response{Status: 202, Body: pendingBody(&rec), RetryAfter: OverloadRetryAfter}, nil
		}
		defer done()
		return e.decided(ctx, rec, string(kind), ": new, inserted, admitted, sending to the acquirer", e.driveAttempt(ctx, rec, token, false)), nil
	}
	if resp, done, err := e.answerExisting(ctx, rec, fp, ""); done {
		return resp, err
	}
	return e.takeOver(ctx, client, rec, token)
}

// runOperation is run for a capture's or a cancel's record: the acquirer's
// capture or void with the operation's reference (looked up first when
// lookFirst), then the final answer stored as token, or the record handed
// to recovery.
func (e *Engine) runOperation(ctx context.Context, rec chargeonce.KeyRecord, token string, backoff time.Duration, recovering, lookFirst bool) Response {
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.opts.AcquirerTimeout)
	res, err := e.acquireOperation(actx, &rec, lookFirst)
	cancel()
	if err == nil && !res.Status.Final() {
		err = fmt.Errorf("acquirer answered %s status %q, not a final one", rec.Kind(), res.Status)
	}
	if err != nil {
		return e.unknown(ctx, &rec, token, backoff, recovering, err)
	}
	op := *rec.Operation
	op.Status, op.FailureReason = res.Status, res.FailureReason
	resp := OperationResponse(rec.Charge, &op)
	return e.settle(ctx, &rec, token, backoff, recovering, resp, chargeonce.KeyCompleteParams{
		OperationStatus: op.Status,
		FailureReason:   op.FailureReason,
	})
}

// OperationResponse builds the response stored for a capture or cancel of
// the authorized charge ch that settled as op.Status: 200 with the charge
// captured (for the operation's amount) or canceled when it succeeded, a
// 402 operation-failed problem when the acquirer refused it.
func OperationResponse(ch chargeonce.Charge, op *chargeonce.Operation) Response {
	if op.Status != chargeonce.OperationSucceeded {
		return operationFailed(&ch, op)
	}
	ch.Status, ch.CapturedCents = chargeonce.StatusCanceled, 0
	if op.Kind == chargeonce.KindCapture {
		ch.Status, ch.CapturedCents = chargeonce.StatusCaptured, op.AmountCents
	}
	return Response{Status: 200, Body: EncodeCharge(&ch)}
}

// operationFailed is the stored answer of a capture or cancel the acquirer
// refused: a 402 problem naming the charge, which stays authorized.
func operationFailed(ch *chargeonce.Charge, op *chargeonce.Operation) Response {
	reason := op.FailureReason
	if reason == "" {
		reason = "failed"
	}
	title := "Capture failed"
	if op.Kind == chargeonce.KindCancel {
		title = "Cancel failed"
	}
	body, _ := json.Marshal(chargeonce.Problem{
		Type:        chargeonce.ProblemTypeBase + chargeonce.EOPERATIONFAILED,
		Title:       title,
		Status:      402,
		Detail:      "The acquirer refused the " + string(op.Kind) + " of charge " + ch.ID + " (" + reason + "); the charge is still " + string(ch.Status) + ".",
		ChargeID:    ch.ID,
		DeclineCode: reason,
	})
	return Response{Status: 402, Body: body}
}

// DeclineOperationRejected is the failure reason of a capture or cancel
// the acquirer refused outright (chargeonce.ErrCaptureRejected).
const DeclineOperationRejected = "acquirer_rejected"

// acquireOperation asks the acquirer for the operation's outcome, as
// acquire does for a charge: a lookup first when lookFirst, then the
// capture or void with its reference unless the lookup found it settled.
func (e *Engine) acquireOperation(ctx context.Context, rec *chargeonce.KeyRecord, lookFirst bool) (chargeonce.OperationResult, error) {
	acq, ok := e.acquirer.(chargeonce.ManualCapturer)
	if !ok {
		return chargeonce.OperationResult{}, errors.New("the acquirer cannot capture or cancel authorizations")
	}
	if lookFirst {
		lr, err := acq.OperationLookup(ctx, rec.LookupRequest(chargeonce.LookupToResend))
		if found, err := lookedUp(rec, lr, err); found || err != nil {
			return lr.Operation, err
		}
	}
	op := rec.Operation
	call := chargeonce.OperationCall{
		Reference:       op.Reference(),
		ChargeReference: rec.Charge.Reference(),
		Merchant:        op.MerchantID,
		AmountCents:     op.AmountCents,
		Currency:        op.Currency,
	}
	start := time.Now()
	var res chargeonce.OperationResult
	var err error
	if op.Kind == chargeonce.KindCancel {
		res, err = acq.Void(ctx, call)
	} else {
		res, err = acq.CaptureAuthorized(ctx, call)
	}
	if e.opts.Observer != nil {
		e.opts.Observer.AcquirerCall(time.Since(start), err)
	}
	if errors.Is(err, chargeonce.ErrCaptureRejected) {
		e.log.WarnContext(ctx, "the acquirer refused the "+string(op.Kind)+"; settling it as failed",
			"operation_id", op.ID, "charge_id", op.ChargeID, "merchant", op.MerchantID, "err", err)
		return chargeonce.OperationResult{Reference: op.Reference(), Status: chargeonce.OperationFailed, FailureReason: DeclineOperationRejected}, nil
	}
	return res, err
}
