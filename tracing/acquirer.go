package tracing

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/chargeonce/chargeonce"
)

// Acquirer returns a with every Capture and Lookup in a span of its own
// ("acquirer.Capture"), carrying the reference and the answer. Under it
// lies the HTTP client's span when the acquirer is reached over HTTP (wrap
// its client with Transport). The span is an internal one, not a client
// span, so the acquirer calls recovery makes on its own, with no request
// above them, are sampled as traces of their own (see Sampler). Returns a
// itself when t is nil.
func (t *Tracing) Acquirer(a chargeonce.Acquirer) chargeonce.Acquirer {
	if t == nil {
		return a
	}
	ta := &tracedAcquirer{next: a, tracer: t.tracer}
	if r, ok := a.(chargeonce.Refunder); ok {
		// An acquirer that refunds still does once traced, and one that
		// captures manually still does too (capture.go).
		tr := &tracedRefunder{tracedAcquirer: ta, refunder: r}
		if m, ok := a.(chargeonce.ManualCapturer); ok {
			return &tracedManualCapturer{tracedRefunder: tr, manual: m}
		}
		return tr
	}
	return ta
}

// tracedRefunder traces a Refunder's refunds and their lookups too.
type tracedRefunder struct {
	*tracedAcquirer
	refunder chargeonce.Refunder
}

func (a *tracedRefunder) Refund(ctx context.Context, req chargeonce.RefundCall) (chargeonce.RefundResult, error) {
	ctx, span := a.tracer.Start(ctx, "acquirer.Refund", trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(AttrReference.String(req.Reference), AttrMerchant.String(req.Merchant)))
	defer span.End()
	res, err := a.refunder.Refund(ctx, req)
	if err != nil {
		span.RecordError(err)
	} else {
		span.SetAttributes(AttrStatus.String(string(res.Status)))
	}
	return res, err
}

func (a *tracedRefunder) RefundLookup(ctx context.Context, req chargeonce.LookupRequest) (chargeonce.LookupResult, error) {
	ctx, span := a.tracer.Start(ctx, "acquirer.RefundLookup", trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(AttrReference.String(req.Reference)))
	defer span.End()
	res, err := a.refunder.RefundLookup(ctx, req)
	if err != nil {
		span.RecordError(err)
	}
	return res, err
}

type tracedAcquirer struct {
	next   chargeonce.Acquirer
	tracer trace.Tracer
}

func (a *tracedAcquirer) Capture(ctx context.Context, req chargeonce.CaptureRequest) (chargeonce.CaptureResult, error) {
	ctx, span := a.tracer.Start(ctx, "acquirer.Capture", trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(AttrReference.String(req.Reference), AttrMerchant.String(req.Merchant)))
	defer span.End()
	res, err := a.next.Capture(ctx, req)
	switch {
	case err == nil:
		span.SetAttributes(AttrStatus.String(string(res.Status)))
		if res.DeclineCode != "" {
			span.SetAttributes(AttrDecline.String(res.DeclineCode))
		}
	case errors.Is(err, chargeonce.ErrCaptureRejected):
		span.SetAttributes(AttrStatus.String("rejected"))
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	default:
		// The outcome is unknown: recovery will settle it.
		span.SetAttributes(AttrStatus.String("unknown"))
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	return res, err
}

func (a *tracedAcquirer) Lookup(ctx context.Context, req chargeonce.LookupRequest) (chargeonce.LookupResult, error) {
	ctx, span := a.tracer.Start(ctx, "acquirer.Lookup", trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(AttrReference.String(req.Reference)))
	defer span.End()
	res, err := a.next.Lookup(ctx, req)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		return res, err
	}
	span.SetAttributes(AttrLookup.String(res.Status.String()))
	if res.Status == chargeonce.LookupFound {
		span.SetAttributes(AttrStatus.String(string(res.Result.Status)))
	}
	return res, nil
}
