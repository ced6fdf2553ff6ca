package client

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"time"
)

// RefundStatus is the state of a refund (Stripe's names).
type RefundStatus string

// A refund is pending until the acquirer's answer is known; it then ends
// succeeded, failed or canceled (a failed or canceled refund moved no money,
// and its amount may be refunded again).
const (
	RefundPending   RefundStatus = "pending"
	RefundSucceeded RefundStatus = "succeeded"
	RefundFailed    RefundStatus = "failed"
	RefundCanceled  RefundStatus = "canceled"
)

// RefundRequest moves money back from a captured charge.
type RefundRequest struct {
	// ChargeID is the captured charge to refund; required.
	ChargeID string `json:"-"`
	// AmountCents is what to refund; zero refunds what remains of the
	// charge.
	AmountCents int64 `json:"amount_cents,omitempty"`
	// Reason is optional, at most 500 characters.
	Reason string `json:"reason,omitempty"`
	// Metadata is optional, with the limits of a charge's.
	Metadata map[string]string `json:"metadata,omitempty"`
	// IdempotencyKey identifies the refund, as a charge's key identifies
	// its intent: store it before the first call and call again with it
	// after a crash or a *GaveUpError, and the refund happens once. Empty:
	// a random key for this call's attempts. A new key is a new refund.
	IdempotencyKey string `json:"-"`
}

// Refund is the service's refund object.
type Refund struct {
	ID          string       `json:"id"`
	ChargeID    string       `json:"charge_id"`
	AmountCents int64        `json:"amount_cents"`
	Currency    string       `json:"currency"`
	Status      RefundStatus `json:"status"`
	// Reason and FailureReason are JSON null when empty.
	Reason        string            `json:"reason"`
	FailureReason string            `json:"failure_reason"`
	CreatedAt     time.Time         `json:"created_at"`
	Metadata      map[string]string `json:"metadata,omitempty"`

	// Replayed and Attempts are as for a Charge.
	Replayed bool `json:"-"`
	Attempts int  `json:"-"`
}

// Refund refunds req.ChargeID once, retrying with one key and one body, as
// CreateCharge does, until the answer is final: 202 (the refund is pending,
// its outcome unknown) is retried like a charge's. It returns the settled
// refund (check Status: a failed refund moved nothing), or an error:
// *ValidationError (slug "refund-exceeds-captured" names the remaining
// amount, "charge-not-refundable" a charge not captured), *KeyReusedError,
// *APIError ("not-found"), or *GaveUpError, whose Key resumes the refund.
func (c *Client) Refund(ctx context.Context, req RefundRequest) (*Refund, error) {
	if req.ChargeID == "" {
		return nil, localValidationError("validation-failed", "Validation failed", "the refund names no charge (ChargeID)")
	}
	ex, n, err := c.post(ctx, "/v1/charges/"+url.PathEscape(req.ChargeID)+"/refunds", req.IdempotencyKey, req)
	if err != nil {
		return nil, err
	}
	return decodeRefund(ex, n)
}

// GetRefund returns the refund's current state.
func (c *Client) GetRefund(ctx context.Context, id string) (*Refund, error) {
	ex, n, err := c.run(ctx, call{method: http.MethodGet, path: "/v1/refunds/" + url.PathEscape(id)})
	if err != nil {
		return nil, err
	}
	if ex.status != http.StatusOK {
		return nil, responseError(ex, n)
	}
	return decodeRefund(ex, n)
}

func decodeRefund(ex *exchange, n int) (*Refund, error) {
	var r struct {
		Refund
		Reason        *string `json:"reason"`
		FailureReason *string `json:"failure_reason"`
	}
	if err := json.Unmarshal(ex.body, &r); err != nil {
		return nil, &finalError{fmt.Errorf("chargeonce: decoding the refund in a %d answer: %w", ex.status, err), n}
	}
	rf := r.Refund
	if r.Reason != nil {
		rf.Reason = *r.Reason
	}
	if r.FailureReason != nil {
		rf.FailureReason = *r.FailureReason
	}
	rf.Replayed, rf.Attempts = ex.replayed, n
	return &rf, nil
}
