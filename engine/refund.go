package engine

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/idempotency"
)

// Refund runs one attempt of a refund of the merchant's charge chargeID,
// identified by (merchant, key) like a charge's intent, with the charge
// protocol: the refund's record is inserted and committed first (the
// store refuses, with nothing written, a refund of a charge that is not
// captured and one past what remains refundable), then the acquirer is
// called with the refund's own reference, and the final answer is stored
// with a compare-and-set on the attempt's token and replayed to every
// retry; 409 while another attempt holds the lease, 422 for a key used for
// another request. req must already be normalised.
//
// A new refund's answer is 201 with the refund once the acquirer settled
// it (succeeded, failed or canceled: the status says which) and 202 with
// the refund pending while its outcome is unknown; recovery, or a retry
// once the back-off is over, looks the reference up before re-sending it.
func (e *Engine) Refund(ctx context.Context, merchantID, chargeID, key string, req *chargeonce.RefundRequest) (Response, error) {
	if err := ctx.Err(); err != nil {
		return Response{}, abandoned(err)
	}
	if _, ok := e.acquirer.(chargeonce.Refunder); !ok {
		return Response{}, chargeonce.Errorf(chargeonce.EUNAVAILABLE, "this service's acquirer cannot refund; nothing was kept for this Idempotency-Key")
	}
	fp := idempotency.RefundFingerprint(chargeID, req)
	if resp, done, err := e.beforeWork(ctx, merchantID, key, fp); done {
		return resp, err
	}
	client := ctx
	token := idempotency.NewToken()
	ctx, cancel := e.detach(ctx)
	defer cancel()
	rec, inserted, err := e.store.RefundInsert(ctx, chargeonce.RefundInsertParams{
		Fingerprint: fp,
		Token:       token,
		Lease:       e.opts.Lease,
		Refund: chargeonce.Refund{
			ID:             idempotency.NewRefundID(),
			MerchantID:     merchantID,
			IdempotencyKey: key,
			ChargeID:       chargeID,
			AmountCents:    req.AmountCents,
			Reason:         req.Reason,
			Metadata:       req.Metadata,
		},
	})
	if err != nil {
		switch chargeonce.ErrorCode(err) {
		case chargeonce.ENOTFOUND, chargeonce.ENOTREFUNDABLE, chargeonce.EREFUNDEXCEEDS, chargeonce.EINVALID:
			return Response{}, err // refused: nothing written
		}
		// The insert may have committed. Nothing is released: a refund
		// once created stays (its amount counts against the charge) and
		// is driven by the retry, once its lease ends, or by recovery.
		return Response{}, fmt.Errorf("%w: beginning refund: %w", chargeonce.Errorf(chargeonce.EUNAVAILABLE,
			"the outcome is unknown; retry with the same Idempotency-Key"), err)
	}
	if inserted {
		done, err := e.admit(client, merchantID)
		if err != nil {
			// Without a slot the refund, committed, is not released (it
			// exists for the charge's other refunds): recovery drives it
			// at once, and the answer says it is pending.
			e.handOff(ctx, rec.ObjectID(), merchantID, key, token, 0, false)
			return Response{Status: 202, Body: pendingBody(&rec), RetryAfter: OverloadRetryAfter}, nil
		}
		defer done()
		return e.decided(ctx, rec, "", "new refund: inserted, admitted, sending to the acquirer", e.driveAttempt(ctx, rec, token, false)), nil
	}
	if resp, done, err := e.answerExisting(ctx, rec, fp, ""); done {
		return resp, err
	}
	return e.takeOver(ctx, client, rec, token)
}

// runRefund is run for a refund's record: the acquirer's refund with the
// refund's reference (looked up first when lookFirst), then the final
// answer stored as token, or the record handed to recovery.
func (e *Engine) runRefund(ctx context.Context, rec chargeonce.KeyRecord, token string, backoff time.Duration, recovering, lookFirst bool) Response {
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.opts.AcquirerTimeout)
	res, err := e.acquireRefund(actx, &rec, lookFirst)
	cancel()
	if err == nil && !res.Status.Final() {
		err = fmt.Errorf("acquirer answered refund status %q, not a final one", res.Status)
	}
	if err != nil {
		return e.unknown(ctx, &rec, token, backoff, recovering, err)
	}
	final := *rec.Refund
	final.Status, final.FailureReason = res.Status, res.FailureReason
	resp := Response{Status: 201, Body: EncodeRefund(&final)}
	return e.settle(ctx, &rec, token, backoff, recovering, resp, chargeonce.KeyCompleteParams{
		RefundStatus:  final.Status,
		FailureReason: final.FailureReason,
	})
}

// DeclineRefundRejected is the failure reason of a refund the acquirer
// refused outright (chargeonce.ErrCaptureRejected): nothing moved.
const DeclineRefundRejected = "acquirer_rejected"

// acquireRefund asks the acquirer for the refund's outcome, as acquire does
// for a capture: a lookup first when lookFirst, then the refund with its
// reference unless the lookup found it settled.
func (e *Engine) acquireRefund(ctx context.Context, rec *chargeonce.KeyRecord, lookFirst bool) (chargeonce.RefundResult, error) {
	acq, ok := e.acquirer.(chargeonce.Refunder)
	if !ok {
		return chargeonce.RefundResult{}, errors.New("the acquirer cannot refund")
	}
	if lookFirst {
		lr, err := acq.RefundLookup(ctx, rec.LookupRequest(chargeonce.LookupToResend))
		if found, err := lookedUp(rec, lr, err); found || err != nil {
			return lr.Refund, err
		}
	}
	rf := rec.Refund
	start := time.Now()
	res, err := acq.Refund(ctx, chargeonce.RefundCall{
		Reference:       rf.Reference(),
		ChargeReference: rec.Charge.Reference(),
		Merchant:        rf.MerchantID,
		AmountCents:     rf.AmountCents,
		Currency:        rf.Currency,
	})
	if e.opts.Observer != nil {
		e.opts.Observer.AcquirerCall(time.Since(start), err)
	}
	if errors.Is(err, chargeonce.ErrCaptureRejected) {
		e.log.WarnContext(ctx, "the acquirer refused the refund; settling it as failed",
			"refund_id", rf.ID, "merchant", rf.MerchantID, "err", err)
		return chargeonce.RefundResult{Reference: rf.Reference(), Status: chargeonce.RefundFailed, FailureReason: DeclineRefundRejected}, nil
	}
	return res, err
}

// pendingBody is what a 202 shows for rec: the object it guards, as it is
// while the outcome is unknown.
func pendingBody(rec *chargeonce.KeyRecord) []byte {
	if rec.Refund != nil {
		return EncodeRefund(rec.Refund)
	}
	return EncodeCharge(&rec.Charge)
}

// idAttr names the id of what rec guards in log lines.
func idAttr(rec *chargeonce.KeyRecord) string {
	if rec.Operation != nil {
		return "operation_id"
	}
	if rec.Refund != nil {
		return "refund_id"
	}
	return "charge_id"
}

// EncodeRefund renders the public refund object, fields in a fixed order.
func EncodeRefund(rf *chargeonce.Refund) []byte {
	b := make([]byte, 0, 224)
	b = append(b, `{"id":`...)
	b = appendString(b, rf.ID)
	b = append(b, `,"charge_id":`...)
	b = appendString(b, rf.ChargeID)
	b = append(b, `,"amount_cents":`...)
	b = strconv.AppendInt(b, rf.AmountCents, 10)
	b = append(b, `,"currency":`...)
	b = appendString(b, rf.Currency)
	b = append(b, `,"status":`...)
	b = appendString(b, string(rf.Status))
	b = append(b, `,"reason":`...)
	b = appendNullable(b, rf.Reason)
	b = append(b, `,"failure_reason":`...)
	b = appendNullable(b, rf.FailureReason)
	b = append(b, `,"created_at":"`...)
	b = rf.CreatedAt.UTC().AppendFormat(b, time.RFC3339)
	b = append(b, '"')
	b = appendMetadata(b, rf.Metadata)
	return append(b, '}')
}

func appendNullable(b []byte, s string) []byte {
	if s == "" {
		return append(b, "null"...)
	}
	return appendString(b, s)
}
