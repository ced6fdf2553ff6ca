// Package tracing sets up OpenTelemetry tracing for chargeonce's commands
// and wraps the parts a trace goes through: the HTTP API, the store, the
// acquirer and its HTTP client, and the logs (SPEC "Operations").
//
// Tracing is on only when OTEL_EXPORTER_OTLP_ENDPOINT (or its traces-only
// twin OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) is set: Setup then returns a
// *Tracing that exports spans over OTLP/HTTP. Otherwise Setup returns nil,
// and every method of a nil *Tracing hands back what it was given, untouched:
// no wrapper, no global provider, no span, so the hot path costs exactly
// what it costs without this package.
//
// Nothing here sets OpenTelemetry's global tracer provider or propagator:
// each instrumented part is handed the provider and the W3C trace-context
// propagator explicitly, so two in-process instances (tests) never see each
// other's spans.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// Environment variables that turn tracing on (either one), as the
// OpenTelemetry SDKs read them; the OTLP exporter reads the rest of its
// configuration (OTEL_EXPORTER_OTLP_HEADERS, _TIMEOUT, ...) itself.
const (
	EnvEndpoint       = "OTEL_EXPORTER_OTLP_ENDPOINT"
	EnvTracesEndpoint = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
	// EnvSDKDisabled set to true keeps tracing off whatever the endpoint.
	EnvSDKDisabled = "OTEL_SDK_DISABLED"
	// EnvServiceName names the service in every span's resource; the
	// command's name (chargeonce-serve, chargeonce-worker) when unset.
	EnvServiceName = "OTEL_SERVICE_NAME"
)

// ScopeName is the instrumentation scope of chargeonce's own spans.
const ScopeName = "github.com/chargeonce/chargeonce"

// shutdownTimeout bounds how long Shutdown waits for the last spans to be
// exported: an unreachable collector must not hold a process's exit.
const shutdownTimeout = 5 * time.Second

// Tracing is an installed tracer provider. A nil *Tracing is tracing off:
// every method is safe to call on it and changes nothing.
type Tracing struct {
	provider *sdktrace.TracerProvider
	tracer   trace.Tracer
	prop     propagation.TextMapPropagator
}

// Enabled reports whether getenv (os.Getenv when nil) asks for tracing: an
// OTLP endpoint is set and the SDK is not disabled.
func Enabled(getenv func(string) string) bool {
	if getenv == nil {
		getenv = os.Getenv
	}
	if strings.EqualFold(strings.TrimSpace(getenv(EnvSDKDisabled)), "true") {
		return false
	}
	return strings.TrimSpace(getenv(EnvEndpoint)) != "" || strings.TrimSpace(getenv(EnvTracesEndpoint)) != ""
}

// Setup installs tracing when the environment asks for it (Enabled), with
// spans exported in batches over OTLP/HTTP, and returns nil (tracing off)
// when it does not. service is the default service.name (OTEL_SERVICE_NAME
// wins); version becomes service.version. Call Shutdown before exiting, so
// the last spans are sent.
func Setup(ctx context.Context, service, version string) (*Tracing, error) {
	if !Enabled(nil) {
		return nil, nil //nolint:nilnil // nil is tracing off, by design: every method of a nil *Tracing is a no-op
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, fmt.Errorf("tracing: creating the OTLP exporter for %s: %w", endpoint(), err)
	}
	if s := strings.TrimSpace(os.Getenv(EnvServiceName)); s != "" {
		service = s
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(semconv.ServiceName(service), semconv.ServiceVersion(version)),
		resource.WithFromEnv(), // OTEL_RESOURCE_ATTRIBUTES
		resource.WithTelemetrySDK(),
		resource.WithHost(),
	)
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, fmt.Errorf("tracing: describing the service: %w", err)
	}
	return newTracing(sdktrace.WithBatcher(exp), sdktrace.WithResource(res)), nil
}

// endpoint is the OTLP endpoint the environment names, for messages.
func endpoint() string {
	if e := os.Getenv(EnvTracesEndpoint); e != "" {
		return e
	}
	return os.Getenv(EnvEndpoint)
}

// NewWithExporter returns tracing that hands every span to exp as soon as it
// ends (no batching): for tests, with the SDK's in-memory exporter
// (go.opentelemetry.io/otel/sdk/trace/tracetest).
func NewWithExporter(exp sdktrace.SpanExporter) *Tracing {
	return newTracing(sdktrace.WithSyncer(exp))
}

func newTracing(opts ...sdktrace.TracerProviderOption) *Tracing {
	opts = append(opts, sdktrace.WithSampler(Sampler()))
	tp := sdktrace.NewTracerProvider(opts...)
	return &Tracing{
		provider: tp,
		tracer:   tp.Tracer(ScopeName),
		prop:     propagation.TraceContext{},
	}
}

// Sampler is the sampler Setup installs: a span with a sampled parent is
// sampled, a span with an unsampled parent is not, and a span with no parent
// is sampled unless it is a client span. A root client span is a database
// statement or store call that no request, message or acquirer call started:
// the recovery loop's, the sweeper's and the outbox's polls, every second or
// so on every instance. Those would bury the traces an operator looks for;
// what the loops do that matters (re-driving the acquirer) starts a span of
// its own (see Acquirer) and is kept.
func Sampler() sdktrace.Sampler {
	return sdktrace.ParentBased(noClientRoots{})
}

// noClientRoots samples root spans other than client spans.
type noClientRoots struct{}

func (noClientRoots) ShouldSample(p sdktrace.SamplingParameters) sdktrace.SamplingResult {
	d := sdktrace.RecordAndSample
	if p.Kind == trace.SpanKindClient {
		d = sdktrace.Drop
	}
	return sdktrace.SamplingResult{Decision: d, Tracestate: trace.SpanContextFromContext(p.ParentContext).TraceState()}
}

func (noClientRoots) Description() string { return "NoClientRoots" }

// TracerProvider is the provider, or nil when t is nil (tracing off).
func (t *Tracing) TracerProvider() trace.TracerProvider {
	if t == nil {
		return nil
	}
	return t.provider
}

// Shutdown exports the spans still buffered and stops the provider, waiting
// at most a few seconds. Nil-safe.
func (t *Tracing) Shutdown(ctx context.Context) error {
	if t == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
	defer cancel()
	if err := t.provider.Shutdown(ctx); err != nil {
		return fmt.Errorf("tracing: flushing spans: %w", err)
	}
	return nil
}

// untraced are the paths whose requests get no span: probes and scrapes,
// many a minute, that would bury the requests an operator looks for.
var untraced = map[string]bool{"/healthz": true, "/readyz": true, "/metrics": true}

// Handler wraps an HTTP server's handler (serve's API, the acquirer
// simulator) so that every request but the probes and scrapes runs in a
// server span, continuing the caller's trace when the request carries a
// W3C traceparent header. Wrap it outside the request log (LogRequests), so
// the log line of a request carries its trace id. Returns h itself when t
// is nil.
func (t *Tracing) Handler(h http.Handler, operation string) http.Handler {
	if t == nil {
		return h
	}
	return otelhttp.NewHandler(h, operation,
		otelhttp.WithTracerProvider(t.provider),
		otelhttp.WithPropagators(t.prop),
		otelhttp.WithFilter(func(r *http.Request) bool { return !untraced[r.URL.Path] }),
		otelhttp.WithSpanNameFormatter(func(_ string, r *http.Request) string { return spanName(r) }),
	)
}

// spanName names a server span by its method and, once routed, its route
// ("POST /v1/charges"); never by the raw path, which a client chooses.
func spanName(r *http.Request) string {
	if r.Pattern == "" {
		return r.Method
	}
	if strings.HasPrefix(r.Pattern, r.Method+" ") {
		return r.Pattern
	}
	return r.Method + " " + r.Pattern
}

// Route wraps the handler that routes requests (the API's mux), inside the
// request log and Handler: once the request is served, its span is named by
// the route that served it ("POST /v1/charges"; the route, never the raw
// path a client chose) and carries its Request-Id, so a trace and a request
// log line or a problem body can be found from each other. Returns h itself
// when t is nil.
func (t *Tracing) Route(h http.Handler) http.Handler {
	if t == nil {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r)
		span := trace.SpanFromContext(r.Context())
		if !span.IsRecording() {
			return
		}
		if r.Pattern != "" {
			span.SetName(spanName(r))
			span.SetAttributes(semconv.HTTPRoute(strings.TrimPrefix(r.Pattern, r.Method+" ")))
		}
		if id := w.Header().Get("Request-Id"); id != "" {
			span.SetAttributes(attribute.String("chargeonce.request_id", id))
		}
	})
}

// Transport wraps an HTTP client's transport (the acquirer's client, the
// Stripe adapter's) so that every request runs in a client span and carries
// the trace to the server in a traceparent header. Returns rt itself when t
// is nil.
func (t *Tracing) Transport(rt http.RoundTripper) http.RoundTripper {
	if t == nil {
		return rt
	}
	if rt == nil {
		rt = http.DefaultTransport
	}
	return otelhttp.NewTransport(rt,
		otelhttp.WithTracerProvider(t.provider),
		otelhttp.WithPropagators(t.prop),
	)
}

// Propagator is the propagator spans travel between processes with: W3C
// trace context. Nil when t is nil.
func (t *Tracing) Propagator() propagation.TextMapPropagator {
	if t == nil {
		return nil
	}
	return t.prop
}
