package stripe

import (
	"context"

	"github.com/chargeonce/chargeonce"
)

// RefundIntent creates the Refund of req on the PaymentIntent pi, without
// finding the PaymentIntent first: the wire test sends it to stripe-mock,
// whose fixtures carry none of our metadata.
func (a *Acquirer) RefundIntent(ctx context.Context, pi string, req chargeonce.RefundCall) (chargeonce.RefundResult, error) {
	return a.refundIntent(ctx, pi, req.AmountCents, req)
}

// RefundOn looks reference up among the refunds of the PaymentIntent pi.
func (a *Acquirer) RefundOn(ctx context.Context, pi, reference string) (chargeonce.LookupResult, error) {
	return a.refundOn(ctx, pi, reference)
}

// CaptureIntent captures req on the PaymentIntent pi, and VoidIntent
// cancels it, without finding the PaymentIntent first (the wire test).
func (a *Acquirer) CaptureIntent(ctx context.Context, pi string, req chargeonce.OperationCall) (chargeonce.OperationResult, error) {
	return a.capture(ctx, pi, req.AmountCents, req)
}

// VoidIntent: see CaptureIntent.
func (a *Acquirer) VoidIntent(ctx context.Context, pi string, req chargeonce.OperationCall) (chargeonce.OperationResult, error) {
	return a.void(ctx, pi, req)
}
