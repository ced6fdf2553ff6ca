package httpapi_test

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/httpapi"
	"github.com/chargeonce/chargeonce/internal/apitest"
	"github.com/chargeonce/chargeonce/replaycache"
)

// BenchmarkReplayFromMemory measures the whole of a replay that the replay
// cache answers, as `serve` wires it: auth, key parsing, strict decoding,
// validation, fingerprint, engine and the stored bytes, with no database
// round trip. What is left is chargeonce's own cost per request.
func BenchmarkReplayFromMemory(b *testing.B) {
	store := apitest.SQLiteStore(b)
	sim := apitest.Simulator(b, acquirer.Options{})
	keys, err := httpapi.ParseKeys("demo:" + apitest.APIKey)
	if err != nil {
		b.Fatal(err)
	}
	eng := engine.New(replaycache.New(store, replaycache.Options{}), sim, engine.Options{})
	h := httpapi.New(httpapi.Config{Engine: eng, Store: store, Keys: keys})
	const body = `{"order_id": 123, "amount_cents": 25000, "currency": "BRL", "payment_token": "tok_ok"}`
	do := func() *httptest.ResponseRecorder {
		r := httptest.NewRequestWithContext(context.Background(), "POST", "/v1/charges", strings.NewReader(body))
		r.Header.Set("Authorization", "Bearer "+apitest.APIKey)
		r.Header.Set("Idempotency-Key", "bench-replay")
		r.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	if w := do(); w.Code != 201 {
		b.Fatalf("first: %d %s", w.Code, w.Body)
	}
	b.ReportAllocs()
	for b.Loop() {
		if w := do(); w.Code != 201 || w.Header().Get("Idempotent-Replayed") != "true" {
			b.Fatalf("replay: %d %s", w.Code, w.Body)
		}
	}
}
