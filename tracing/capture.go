package tracing

import (
	"context"

	"go.opentelemetry.io/otel/trace"

	"github.com/chargeonce/chargeonce"
)

// tracedManualCapturer traces a ManualCapturer's authorizations, captures,
// voids and their lookups too.
type tracedManualCapturer struct {
	*tracedRefunder
	manual chargeonce.ManualCapturer
}

func (a *tracedManualCapturer) span(ctx context.Context, name, reference, merchant string) (context.Context, trace.Span) {
	return a.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(AttrReference.String(reference), AttrMerchant.String(merchant)))
}

func (a *tracedManualCapturer) Authorize(ctx context.Context, req chargeonce.CaptureRequest) (chargeonce.CaptureResult, error) {
	ctx, span := a.span(ctx, "acquirer.Authorize", req.Reference, req.Merchant)
	defer span.End()
	res, err := a.manual.Authorize(ctx, req)
	if err != nil {
		span.RecordError(err)
	} else {
		span.SetAttributes(AttrStatus.String(string(res.Status)))
	}
	return res, err
}

func (a *tracedManualCapturer) CaptureAuthorized(ctx context.Context, req chargeonce.OperationCall) (chargeonce.OperationResult, error) {
	ctx, span := a.span(ctx, "acquirer.CaptureAuthorized", req.Reference, req.Merchant)
	defer span.End()
	res, err := a.manual.CaptureAuthorized(ctx, req)
	if err != nil {
		span.RecordError(err)
	} else {
		span.SetAttributes(AttrStatus.String(string(res.Status)))
	}
	return res, err
}

func (a *tracedManualCapturer) Void(ctx context.Context, req chargeonce.OperationCall) (chargeonce.OperationResult, error) {
	ctx, span := a.span(ctx, "acquirer.Void", req.Reference, req.Merchant)
	defer span.End()
	res, err := a.manual.Void(ctx, req)
	if err != nil {
		span.RecordError(err)
	} else {
		span.SetAttributes(AttrStatus.String(string(res.Status)))
	}
	return res, err
}

func (a *tracedManualCapturer) OperationLookup(ctx context.Context, req chargeonce.LookupRequest) (chargeonce.LookupResult, error) {
	ctx, span := a.span(ctx, "acquirer.OperationLookup", req.Reference, "")
	defer span.End()
	res, err := a.manual.OperationLookup(ctx, req)
	if err != nil {
		span.RecordError(err)
	}
	return res, err
}
