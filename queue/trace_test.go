package queue_test

import (
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/internal/apitest"
	"github.com/chargeonce/chargeonce/queue"
	"github.com/chargeonce/chargeonce/tracing"
)

// TestTraceFollowsAMessageFromPublishToWorker: a request published in a
// traced send carries its span in NATS headers; the worker's handling
// continues that trace (its consumer span a child of the send), the
// engine's store calls and acquirer call lie beneath it, and the result
// message carries the trace on.
func TestTraceFollowsAMessageFromPublishToWorker(t *testing.T) {
	t.Parallel()
	e := setup(t)
	exp := tracetest.NewInMemoryExporter()
	tr := tracing.NewWithExporter(exp)
	t.Cleanup(func() { _ = tr.Shutdown(t.Context()) })
	eng := engine.New(tr.Store(e.store, "postgresql"), tr.Acquirer(e.acq.client()), e.opts)
	w := queue.NewWorker(e.js, eng, e.store, queue.WorkerOptions{Durable: "traced", TracerProvider: tr.TracerProvider()})
	if err := w.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)

	const key = "traced-message"
	m := nats.NewMsg(queue.RequestSubject(merchant))
	m.Header.Set(queue.HeaderIdempotencyKey, key)
	m.Data = []byte(`{"order_id": 77, "amount_cents": 1200, "currency": "BRL", "payment_token": "tok_ok"}`)
	ctx, end := queue.TracePublish(t.Context(), tr.TracerProvider(), m)
	_, err := e.js.PublishMsg(ctx, m)
	end(err)
	if err != nil {
		t.Fatal(err)
	}
	send := trace.SpanFromContext(ctx).SpanContext()
	if m.Header.Get("traceparent") == "" {
		t.Fatalf("the request's headers carry no traceparent: %v", m.Header)
	}

	results := e.waitResults(30*time.Second, key)[key]
	if len(results) != 1 || results[0].status() != "201" {
		t.Fatalf("results: %+v", results)
	}
	var process tracetest.SpanStub
	apitest.Eventually(t, 10*time.Second, "the worker's span to end", func() bool {
		for _, sp := range exp.GetSpans() {
			if sp.Name == "process charges.request" {
				process = sp
				return true
			}
		}
		return false
	})
	if process.SpanContext.TraceID() != send.TraceID() || process.Parent.SpanID() != send.SpanID() || process.SpanKind != trace.SpanKindConsumer {
		t.Fatalf("the worker's span (trace %s, parent %s, %s) does not continue the send (trace %s, span %s)",
			process.SpanContext.TraceID(), process.Parent.SpanID(), process.SpanKind, send.TraceID(), send.SpanID())
	}
	var names []string
	for _, sp := range exp.GetSpans() {
		if sp.Parent.SpanID() == process.SpanContext.SpanID() {
			names = append(names, sp.Name)
		}
		if sp.Name == "send charges.request" && sp.SpanKind != trace.SpanKindProducer {
			t.Errorf("the send's span is a %s span, want producer", sp.SpanKind)
		}
	}
	got := strings.Join(names, ",")
	t.Logf("under %q: %s", process.Name, got)
	for _, want := range []string{"store.KeyInsert", "acquirer.Capture", "store.KeyComplete"} {
		if !strings.Contains(got, want) {
			t.Errorf("no %s under the worker's span; got %s", want, got)
		}
	}
	for _, a := range process.Attributes {
		if a.Key == "chargeonce.queue.outcome" && a.Value.AsString() != queue.OutcomeAnswered {
			t.Errorf("outcome %q, want %q", a.Value.AsString(), queue.OutcomeAnswered)
		}
	}

	// The result carries the worker's span on.
	res := propagation.TraceContext{}.Extract(t.Context(), queue.HeaderCarrier(results[0].header))
	if sc := trace.SpanContextFromContext(res); sc.TraceID() != send.TraceID() || sc.SpanID() != process.SpanContext.SpanID() {
		t.Errorf("the result's traceparent %q names span %s of trace %s, want the worker's span %s of trace %s",
			results[0].header.Get("traceparent"), sc.SpanID(), sc.TraceID(), process.SpanContext.SpanID(), send.TraceID())
	}
}

// TestUntracedWorkerIgnoresTraceHeaders: a worker without a tracer
// provider reads nothing from the headers and passes nothing on, whatever
// the request carries.
func TestUntracedWorkerIgnoresTraceHeaders(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.worker(queue.WorkerOptions{Durable: "untraced"})
	const key = "untraced-message"
	e.send(key, `{"order_id": 78, "amount_cents": 1200, "currency": "BRL", "payment_token": "tok_ok"}`, "",
		"traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	results := e.waitResults(30*time.Second, key)[key]
	if len(results) != 1 || results[0].status() != "201" {
		t.Fatalf("results: %+v", results)
	}
	if tp := results[0].header.Get("traceparent"); tp != "" {
		t.Errorf("an untraced worker's result carries traceparent %q", tp)
	}
}
