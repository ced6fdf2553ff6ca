package tracing_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/httpapi"
	"github.com/chargeonce/chargeonce/internal/apitest"
	"github.com/chargeonce/chargeonce/internal/pgtest"
	"github.com/chargeonce/chargeonce/postgres"
	"github.com/chargeonce/chargeonce/replaycache"
	"github.com/chargeonce/chargeonce/tracing"
)

func TestMain(m *testing.M) { pgtest.VerifyMain(m) }

// world is chargeonce wired as `serve` wires it with tracing on: a traced
// PostgreSQL store (statements, batches, store calls), a traced acquirer
// reached over HTTP (its client, and the simulator's server continuing the
// trace), the API wrapped in the server span and the request log.
type world struct {
	t    *testing.T
	exp  *tracetest.InMemoryExporter
	api  string
	logs *apitest.Buffer
}

func setup(t *testing.T) *world {
	t.Helper()
	ctx := context.Background()
	exp := tracetest.NewInMemoryExporter()
	tr := tracing.NewWithExporter(exp)
	t.Cleanup(func() { _ = tr.Shutdown(ctx) })

	sim := apitest.Simulator(t, acquirer.Options{})
	acqSrv := httptest.NewServer(tr.Handler(tr.Route(acquirer.Handler(sim)), "acquirer"))
	t.Cleanup(acqSrv.Close)
	transport := &http.Transport{}
	t.Cleanup(transport.CloseIdleConnections)
	acq := tr.Acquirer(acquirer.NewClient(acqSrv.URL, &http.Client{Transport: tr.Transport(transport)}))

	raw, err := postgres.Open(ctx, pgtest.URL(t), postgres.WithTracerProvider(tr.TracerProvider()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { raw.Close() })
	if err := raw.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	store := tr.Store(raw, "postgresql")

	logs := &apitest.Buffer{}
	log := tr.Logger(slog.New(slog.NewTextHandler(logs, nil)))
	keys, err := httpapi.ParseKeys(httpapi.DemoAPIKeys)
	if err != nil {
		t.Fatal(err)
	}
	eng := engine.New(replaycache.New(store, replaycache.Options{}), acq, engine.Options{Logger: log})
	api := httpapi.New(httpapi.Config{Engine: eng, Store: store, Keys: keys, Logger: log})
	srv := httptest.NewServer(tr.Handler(httpapi.LogRequests(log, tr.Route(api)), "chargeonce"))
	t.Cleanup(srv.Close)
	exp.Reset() // the migration's statements
	return &world{t: t, exp: exp, api: srv.URL, logs: logs}
}

func (w *world) charge(key string, order int) apitest.Result {
	w.t.Helper()
	body := fmt.Sprintf(`{"order_id": %d, "amount_cents": 25000, "currency": "BRL", "payment_token": "tok_ok"}`, order)
	return apitest.Charge(w.t, w.api, key, body)
}

// spans indexes the exported spans.
type spans struct {
	all  tracetest.SpanStubs
	byID map[trace.SpanID]tracetest.SpanStub
}

func (w *world) spans() spans {
	s := spans{all: w.exp.GetSpans(), byID: map[trace.SpanID]tracetest.SpanStub{}}
	for _, sp := range s.all {
		s.byID[sp.SpanContext.SpanID()] = sp
	}
	return s
}

// in returns the spans of trace id named name.
func (s spans) in(id trace.TraceID, name string) []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, sp := range s.all {
		if sp.SpanContext.TraceID() == id && sp.Name == name {
			out = append(out, sp)
		}
	}
	return out
}

// one returns the only span of trace id named name whose parent is parent.
func (s spans) one(t *testing.T, id trace.TraceID, name string, parent tracetest.SpanStub) tracetest.SpanStub {
	t.Helper()
	var found []tracetest.SpanStub
	for _, sp := range s.in(id, name) {
		if sp.Parent.SpanID() == parent.SpanContext.SpanID() {
			found = append(found, sp)
		}
	}
	if len(found) != 1 {
		t.Fatalf("want one %q span under %q in trace %s, got %d; the trace:\n%s", name, parent.Name, id, len(found), s.dump(id))
	}
	return found[0]
}

// children returns the spans whose parent is p.
func (s spans) children(p tracetest.SpanStub) []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, sp := range s.all {
		if sp.Parent.SpanID() == p.SpanContext.SpanID() && sp.SpanContext.TraceID() == p.SpanContext.TraceID() {
			out = append(out, sp)
		}
	}
	return out
}

func (s spans) dump(id trace.TraceID) string {
	var b strings.Builder
	for _, sp := range s.all {
		if sp.SpanContext.TraceID() == id {
			parent := "-"
			if p, ok := s.byID[sp.Parent.SpanID()]; ok {
				parent = p.Name
			}
			fmt.Fprintf(&b, "  %-28s kind=%-8s parent=%s\n", sp.Name, sp.SpanKind, parent)
		}
	}
	return b.String()
}

func attr(sp tracetest.SpanStub, key string) string {
	for _, a := range sp.Attributes {
		if string(a.Key) == key {
			return a.Value.String()
		}
	}
	return ""
}

// server returns the API's server span of the request answered with
// requestID.
func (s spans) server(t *testing.T, requestID string) tracetest.SpanStub {
	t.Helper()
	for _, sp := range s.all {
		if sp.SpanKind == trace.SpanKindServer && attr(sp, "chargeonce.request_id") == requestID {
			return sp
		}
	}
	t.Fatalf("no server span carries request id %s; spans: %d", requestID, len(s.all))
	return tracetest.SpanStub{}
}

// TestOneTraceFromRequestThroughStoreToAcquirer follows one POST
// /v1/charges: the server span, each store call beneath it with its SQL
// statement beneath that, the acquirer call with its HTTP client span and
// the simulator's own server span (the trace crossed the wire in a
// traceparent header), and the request's log line naming the trace.
func TestOneTraceFromRequestThroughStoreToAcquirer(t *testing.T) {
	t.Parallel()
	w := setup(t)
	res := w.charge("trace-one", 1)
	if res.Status != 201 {
		t.Fatalf("charge: %d %s", res.Status, res.Body)
	}
	s := w.spans()
	srv := s.server(t, res.Header.Get("Request-Id"))
	id := srv.SpanContext.TraceID()
	t.Logf("the trace of one charge:\n%s", s.dump(id))
	if srv.Name != "POST /v1/charges" || attr(srv, "http.route") != "/v1/charges" {
		t.Errorf("server span: name %q, http.route %q; want POST /v1/charges, /v1/charges", srv.Name, attr(srv, "http.route"))
	}
	if attr(srv, "http.response.status_code") != "201" {
		t.Errorf("server span status code %q, want 201", attr(srv, "http.response.status_code"))
	}

	insert := s.one(t, id, "store.KeyInsert", srv)
	if attr(insert, "chargeonce.merchant") != "demo" || attr(insert, "chargeonce.inserted") != "true" || attr(insert, "db.system.name") != "postgresql" {
		t.Errorf("store.KeyInsert attributes: %v", insert.Attributes)
	}
	wantStatement(t, s, insert, "INSERT")

	capture := s.one(t, id, "acquirer.Capture", srv)
	if attr(capture, "chargeonce.acquirer.status") != "captured" {
		t.Errorf("acquirer.Capture status %q, want captured", attr(capture, "chargeonce.acquirer.status"))
	}
	var client tracetest.SpanStub
	for _, c := range s.children(capture) {
		if c.SpanKind == trace.SpanKindClient {
			client = c
		}
	}
	if !client.SpanContext.IsValid() {
		t.Fatalf("no HTTP client span under acquirer.Capture:\n%s", s.dump(id))
	}
	var simSpan tracetest.SpanStub
	for _, c := range s.children(client) {
		if c.SpanKind == trace.SpanKindServer {
			simSpan = c
		}
	}
	if !simSpan.SpanContext.IsValid() || !strings.HasPrefix(simSpan.Name, "POST ") {
		t.Fatalf("the simulator's server span is not under the client span (traceparent lost?):\n%s", s.dump(id))
	}

	complete := s.one(t, id, "store.KeyComplete", srv)
	wantStatement(t, s, complete, "UPDATE")
	if !insert.EndTime.Before(capture.StartTime) || !capture.EndTime.Before(complete.StartTime) {
		t.Errorf("want KeyInsert, then Capture, then KeyComplete; got %v-%v, %v-%v, %v-%v",
			insert.StartTime, insert.EndTime, capture.StartTime, capture.EndTime, complete.StartTime, complete.EndTime)
	}

	line := regexp.MustCompile(`(?m)^.*msg=request .*request_id=` + regexp.QuoteMeta(res.Header.Get("Request-Id")) + `.*$`).FindString(w.logs.String())
	if !strings.Contains(line, "trace_id="+id.String()) || !strings.Contains(line, "span_id="+srv.SpanContext.SpanID().String()) {
		t.Errorf("the request's log line does not name its trace %s and span %s:\n%s", id, srv.SpanContext.SpanID(), line)
	}

	// The first replay reads the stored answer (store.KeyInsert finds the
	// key taken); the next is answered from memory, touching no store.
	for i, wantCalls := range []int{1, 0} {
		w.exp.Reset()
		again := w.charge("trace-one", 1)
		if again.Header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("replay %d: %d %v", i+1, again.Status, again.Header)
		}
		s = w.spans()
		replay := s.server(t, again.Header.Get("Request-Id"))
		if kids := s.children(replay); len(kids) != wantCalls {
			t.Errorf("replay %d: %d spans beneath it, want %d:\n%s", i+1, len(kids), wantCalls, s.dump(replay.SpanContext.TraceID()))
		}
	}
}

// wantStatement fails unless the span of a statement doing verb (the
// postgres store names them by the verbs that change rows) lies beneath
// call, or call's statement went into a batch (postgres.batch, checked by
// TestBatchSpanLinksEveryAttempt).
func wantStatement(t *testing.T, s spans, call tracetest.SpanStub, verb string) {
	t.Helper()
	var under func(p tracetest.SpanStub, depth int) bool
	under = func(p tracetest.SpanStub, depth int) bool {
		for _, c := range s.children(p) {
			if c.SpanKind == trace.SpanKindClient && strings.Contains(c.Name, verb) && attr(c, "db.query.text") != "" {
				return true
			}
			if c.Name == "postgres.batch" && call.Name != "postgres.batch" {
				return true
			}
			if depth < 3 && under(c, depth+1) {
				return true
			}
		}
		return false
	}
	if !under(call, 0) {
		t.Errorf("no %s statement span under %s:\n%s", verb, call.Name, s.dump(call.SpanContext.TraceID()))
	}
}

// TestBatchSpanLinksEveryAttempt sends concurrent charges until some of
// their inserts or completions share one batch statement, and checks that
// the batch's span lies in the trace of the attempt whose context it runs
// on, with its statement beneath it, and links every attempt it carried,
// each of which links back to it.
func TestBatchSpanLinksEveryAttempt(t *testing.T) {
	t.Parallel()
	w := setup(t)
	const clients = 32
	var batches []tracetest.SpanStub
	for round := 0; round < 20 && len(batches) == 0; round++ {
		var wg sync.WaitGroup
		for i := range clients {
			wg.Go(func() {
				if res := w.charge(fmt.Sprintf("batch-%d-%d", round, i), 1000*round+i+1); res.Status != 201 {
					t.Errorf("charge: %d %s", res.Status, res.Body)
				}
			})
		}
		wg.Wait()
		for _, sp := range w.exp.GetSpans() {
			if sp.Name == "postgres.batch" {
				batches = append(batches, sp)
			}
		}
	}
	if len(batches) == 0 {
		t.Fatal("20 rounds of 32 concurrent charges formed no batch")
	}
	s := w.spans()
	t.Logf("%d batches; the first carried %s attempts", len(batches), attr(batches[0], "chargeonce.batch.size"))
	for _, b := range batches {
		parent, ok := s.byID[b.Parent.SpanID()]
		if !ok || !strings.HasPrefix(parent.Name, "store.Key") || parent.SpanContext.TraceID() != b.SpanContext.TraceID() {
			t.Fatalf("batch span's parent is %q (found %v), want the store call of its first attempt", parent.Name, ok)
		}
		if len(b.Links) < 2 || fmt.Sprint(len(b.Links)) != attr(b, "chargeonce.batch.size") {
			t.Errorf("batch of %s attempts links %d", attr(b, "chargeonce.batch.size"), len(b.Links))
		}
		wantStatement(t, s, b, "")
		for _, l := range b.Links {
			call, ok := s.byID[l.SpanContext.SpanID()]
			if !ok || !strings.HasPrefix(call.Name, "store.Key") {
				t.Fatalf("batch links %v, which is not a store call's span", l.SpanContext.SpanID())
			}
			if _, ok := s.byID[call.Parent.SpanID()]; !ok {
				t.Errorf("%s linked by the batch has no parent request span", call.Name)
			}
			back := false
			for _, bl := range call.Links {
				back = back || bl.SpanContext.SpanID() == b.SpanContext.SpanID()
			}
			if !back {
				t.Errorf("%s in trace %s does not link back to its batch", call.Name, call.SpanContext.TraceID())
			}
		}
	}
}

// TestOffInstallsNothing: a nil *Tracing hands back what it is given, so
// tracing off adds no wrapper, no span and no allocation to the hot path.
func TestOffInstallsNothing(t *testing.T) {
	t.Parallel()
	var tr *tracing.Tracing
	if tracing.Enabled(func(string) string { return "" }) {
		t.Fatal("enabled with no endpoint")
	}
	if !tracing.Enabled(func(k string) string {
		return map[string]string{tracing.EnvEndpoint: "http://127.0.0.1:4318"}[k]
	}) {
		t.Fatal("not enabled with an endpoint")
	}
	if tracing.Enabled(func(k string) string {
		return map[string]string{tracing.EnvEndpoint: "http://127.0.0.1:4318", tracing.EnvSDKDisabled: "true"}[k]
	}) {
		t.Fatal("enabled with OTEL_SDK_DISABLED=true")
	}
	h := http.NotFoundHandler()
	store := apitest.SQLiteStore(t)
	sim := apitest.Simulator(t, acquirer.Options{})
	log := slog.New(slog.DiscardHandler)
	rt := &http.Transport{}
	if fmt.Sprintf("%p", tr.Handler(h, "x")) != fmt.Sprintf("%p", h) || fmt.Sprintf("%p", tr.Route(h)) != fmt.Sprintf("%p", h) {
		t.Error("Handler or Route wrapped the handler")
	}
	if tr.Store(store, "sqlite") != store || tr.Acquirer(sim) != sim || tr.Logger(log) != log || tr.Transport(rt) != rt {
		t.Error("a nil *Tracing wrapped something")
	}
	if tr.TracerProvider() != nil || tr.Propagator() != nil || tr.Shutdown(t.Context()) != nil {
		t.Error("a nil *Tracing has a provider")
	}
}

// TestSamplerDropsBackgroundStatements: a client span with no parent (the
// recovery loop's poll, a statement no request sent) is not sampled; one
// under a request is; a root internal span (recovery re-driving the
// acquirer) is.
func TestSamplerDropsBackgroundStatements(t *testing.T) {
	t.Parallel()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp), sdktrace.WithSampler(tracing.Sampler()))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	tracer := tp.Tracer("test")
	_, poll := tracer.Start(context.Background(), "poll", trace.WithSpanKind(trace.SpanKindClient))
	poll.End()
	ctx, req := tracer.Start(context.Background(), "request", trace.WithSpanKind(trace.SpanKindServer))
	_, stmt := tracer.Start(ctx, "statement", trace.WithSpanKind(trace.SpanKindClient))
	stmt.End()
	req.End()
	_, redrive := tracer.Start(context.Background(), "redrive", trace.WithSpanKind(trace.SpanKindInternal))
	redrive.End()
	var got []string
	for _, sp := range exp.GetSpans() {
		got = append(got, sp.Name)
	}
	if strings.Join(got, ",") != "statement,request,redrive" {
		t.Errorf("sampled %v, want statement, request, redrive", got)
	}
}

// TestLogLinesOutsideASpanCarryNoTraceID: the log handler adds ids only
// when a span is active.
func TestLogLinesOutsideASpanCarryNoTraceID(t *testing.T) {
	t.Parallel()
	var b apitest.Buffer
	log := slog.New(tracing.LogHandler(slog.NewTextHandler(&b, nil)))
	log.InfoContext(context.Background(), "no span")
	tp := sdktrace.NewTracerProvider()
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	ctx, span := tp.Tracer("test").Start(context.Background(), "s")
	log.With("a", 1).InfoContext(ctx, "in a span")
	span.End()
	out := b.String()
	first, second, _ := strings.Cut(out, "\n")
	if strings.Contains(first, "trace_id") {
		t.Errorf("a line outside any span names a trace: %s", first)
	}
	if !strings.Contains(second, "trace_id="+span.SpanContext().TraceID().String()) || !strings.Contains(second, "a=1") {
		t.Errorf("a line in a span lacks its trace id: %s", second)
	}
}
