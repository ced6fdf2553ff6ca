package client

import (
	"context"
	"net/url"
)

// captureBody is the body of POST /v1/charges/{id}/capture.
type captureBody struct {
	AmountCents int64 `json:"amount_cents,omitempty"`
}

// cancelBody is the body of POST /v1/charges/{id}/cancel.
type cancelBody struct{}

// Capture captures amountCents of the authorized charge chargeID (created
// with CaptureManual; zero captures the whole authorization) once,
// retrying with one key and one body, as CreateCharge does, until the
// answer is final: a 202 (the outcome is unknown) is retried like a
// charge's. key identifies the capture: store it before the first call and
// call again with it after a crash or a *GaveUpError, and the capture
// happens once; empty, a random key for this call's attempts.
//
// It returns the captured charge (AmountCapturedCents says how much), or an
// error: *ValidationError (slug "charge-not-authorized": the charge is not
// an authorization awaiting its capture, or another capture or cancel holds
// it; "capture-exceeds-authorized"), *DeclinedError (slug
// "operation-failed": the acquirer refused; the charge is still
// authorized), *KeyReusedError, *APIError ("not-found"), or *GaveUpError,
// whose Key resumes the capture.
func (c *Client) Capture(ctx context.Context, chargeID, key string, amountCents int64) (*Charge, error) {
	if chargeID == "" {
		return nil, localValidationError("validation-failed", "Validation failed", "the capture names no charge")
	}
	if amountCents < 0 {
		return nil, localValidationError("validation-failed", "Validation failed", "amount_cents must be positive, or zero to capture the whole authorization")
	}
	ex, n, err := c.post(ctx, "/v1/charges/"+url.PathEscape(chargeID)+"/capture", key, captureBody{AmountCents: amountCents})
	if err != nil {
		return nil, err
	}
	return decodeCharge(ex, n)
}

// Cancel voids the authorized charge chargeID once, with the retry rules
// and errors of Capture; it returns the canceled charge.
func (c *Client) Cancel(ctx context.Context, chargeID, key string) (*Charge, error) {
	if chargeID == "" {
		return nil, localValidationError("validation-failed", "Validation failed", "the cancel names no charge")
	}
	ex, n, err := c.post(ctx, "/v1/charges/"+url.PathEscape(chargeID)+"/cancel", key, cancelBody{})
	if err != nil {
		return nil, err
	}
	return decodeCharge(ex, n)
}
