package queue

import (
	"context"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// A trace travels with a message in NATS headers, as W3C trace context
// (traceparent, tracestate), exactly as it travels with an HTTP request:
// a publisher that traces its send puts its span there (TracePublish), the
// worker continues that trace while it handles the request, and the result
// it publishes carries the worker's span on to whoever reads it.

// tracerScope is the instrumentation scope of the queue's spans.
const tracerScope = "github.com/chargeonce/chargeonce/queue"

// propagator is how trace context travels in headers.
var propagator = propagation.TraceContext{}

// messagingSystem is semconv's messaging.system for NATS.
var messagingSystem = semconv.MessagingSystemKey.String("nats")

// HeaderCarrier adapts NATS headers to OpenTelemetry propagation. NATS
// headers are case-sensitive: keys are written as given (traceparent, in
// lower case as W3C spells it) and read exactly first, then ignoring case,
// so a publisher that capitalised them is still understood.
type HeaderCarrier nats.Header

// Get returns the first value of key.
func (c HeaderCarrier) Get(key string) string {
	if v := nats.Header(c).Get(key); v != "" {
		return v
	}
	for k, vs := range c {
		if strings.EqualFold(k, key) && len(vs) > 0 {
			return vs[0]
		}
	}
	return ""
}

// Set sets key to value.
func (c HeaderCarrier) Set(key, value string) { nats.Header(c).Set(key, value) }

// Keys lists the keys present.
func (c HeaderCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// InjectTrace writes the span of ctx, if any, into m's headers. It does
// nothing when ctx carries no span (tracing off).
func InjectTrace(ctx context.Context, m *nats.Msg) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return
	}
	if m.Header == nil {
		m.Header = nats.Header{}
	}
	propagator.Inject(ctx, HeaderCarrier(m.Header))
}

// ExtractTrace returns ctx carrying, as a remote parent, the span whose
// context h carries, if any.
func ExtractTrace(ctx context.Context, h nats.Header) context.Context {
	return propagator.Extract(ctx, HeaderCarrier(h))
}

// TracePublish starts the producer span of sending m ("send
// charges.request") with tp, under ctx's span if any, and writes it into m's
// headers, so the worker that handles m continues this trace. Call end with
// the publish's error. With a nil tp it starts nothing: it only carries
// ctx's span, if any, in m's headers.
func TracePublish(ctx context.Context, tp trace.TracerProvider, m *nats.Msg) (context.Context, func(error)) {
	if tp == nil {
		InjectTrace(ctx, m)
		return ctx, func(error) {}
	}
	ctx, span := tp.Tracer(tracerScope).Start(ctx, "send "+subjectKind(m.Subject),
		trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(messagingSystem, semconv.MessagingOperationTypeSend,
			semconv.MessagingDestinationName(m.Subject)))
	InjectTrace(ctx, m)
	return ctx, func(err error) {
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}
}

// subjectKind is a subject without its merchant token: a span name must not
// grow with the number of merchants.
func subjectKind(subject string) string {
	switch {
	case strings.HasPrefix(subject, RequestSubjectPrefix):
		return strings.TrimSuffix(RequestSubjectPrefix, ".")
	default:
		if i := strings.LastIndexByte(subject, '.'); i > 0 {
			return subject[:i]
		}
		return subject
	}
}

// startSpan starts the consumer span of handling msg, continuing the trace
// its headers carry; ctx unchanged and a nil span when the worker has no
// tracer.
func (w *Worker) startSpan(ctx context.Context, msg jetstream.Msg) (context.Context, trace.Span) {
	if w.tracer == nil {
		return ctx, nil
	}
	ctx = ExtractTrace(ctx, msg.Headers())
	attrs := []attribute.KeyValue{
		messagingSystem, semconv.MessagingOperationTypeProcess,
		semconv.MessagingDestinationName(msg.Subject()),
		semconv.MessagingConsumerGroupName(w.opts.Durable),
	}
	if id := msg.Headers().Get(jetstream.MsgIDHeader); id != "" {
		attrs = append(attrs, semconv.MessagingMessageID(id))
	}
	if md, err := msg.Metadata(); err == nil {
		attrs = append(attrs,
			attribute.String("chargeonce.queue.stream_seq", strconv.FormatUint(md.Sequence.Stream, 10)),
			attribute.Int64("chargeonce.queue.delivery", int64(md.NumDelivered))) //nolint:gosec // G115: a delivery count fits
	}
	return w.tracer.Start(ctx, "process "+subjectKind(msg.Subject()),
		trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(attrs...))
}

// endSpan ends the span of a message handled to outcome.
func endSpan(span trace.Span, outcome string) {
	if span == nil {
		return
	}
	span.SetAttributes(attribute.String("chargeonce.queue.outcome", outcome))
	if outcome == OutcomeError || outcome == OutcomeGaveUp {
		span.SetStatus(codes.Error, outcome)
	}
	span.End()
}
