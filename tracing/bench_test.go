package tracing_test

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/httpapi"
	"github.com/chargeonce/chargeonce/internal/apitest"
	"github.com/chargeonce/chargeonce/replaycache"
	"github.com/chargeonce/chargeonce/tracing"
)

// benchReplay measures a replay answered from memory through serve's
// wiring (the request log, and tracing's wrappers when tr is not nil).
func benchReplay(b *testing.B, tr *tracing.Tracing) {
	store := tr.Store(apitest.SQLiteStore(b), "sqlite")
	sim := apitest.Simulator(b, acquirer.Options{})
	keys, err := httpapi.ParseKeys(httpapi.DemoAPIKeys)
	if err != nil {
		b.Fatal(err)
	}
	log := tr.Logger(slog.New(slog.DiscardHandler))
	eng := engine.New(replaycache.New(store, replaycache.Options{}), tr.Acquirer(sim), engine.Options{Logger: log})
	api := httpapi.New(httpapi.Config{Engine: eng, Store: store, Keys: keys, Logger: log})
	h := tr.Handler(httpapi.LogRequests(log, tr.Route(api)), "chargeonce")
	const body = `{"order_id": 123, "amount_cents": 25000, "currency": "BRL", "payment_token": "tok_ok"}`
	do := func() *httptest.ResponseRecorder {
		r := httptest.NewRequestWithContext(context.Background(), "POST", "/v1/charges", strings.NewReader(body))
		r.Header.Set("Authorization", "Bearer sk_test_demo")
		r.Header.Set("Idempotency-Key", "bench-replay")
		r.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	for range 2 { // the second reads the stored answer into the cache
		if w := do(); w.Code != 201 {
			b.Fatalf("first: %d %s", w.Code, w.Body)
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		if w := do(); w.Code != 201 || w.Header().Get("Idempotent-Replayed") != "true" {
			b.Fatalf("replay: %d %s", w.Code, w.Body)
		}
	}
}

// BenchmarkReplayTracingOff is serve's request path with tracing off: the
// same allocations as without this package (compare httpapi's
// BenchmarkReplayFromMemory, which has no request log).
func BenchmarkReplayTracingOff(b *testing.B) { benchReplay(b, nil) }

// BenchmarkReplayTracingOn is the same path traced, every span sampled and
// handed to an exporter that drops it: what tracing costs per request.
func BenchmarkReplayTracingOn(b *testing.B) {
	tr := tracing.NewWithExporter(tracetest.NewNoopExporter())
	b.Cleanup(func() { _ = tr.Shutdown(context.Background()) })
	benchReplay(b, tr)
}
