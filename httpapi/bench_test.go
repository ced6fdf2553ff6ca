package httpapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"strings"
	"sync/atomic"
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

// BenchmarkRefundVsNewCharge measures a new refund against a new charge
// through the whole API on each store, 16 clients at once: each is an
// insert first, an in-process acquirer call and the stored answer, and a
// refund must cost no more than a charge. Refunds spread over 256 captured
// charges, as a shop's refunds do, so that they seldom wait on one
// charge's row lock.
func BenchmarkRefundVsNewCharge(b *testing.B) {
	for _, kind := range []string{"postgres", "sqlite"} {
		store := apitest.Store(b, kind)
		sim := apitest.Simulator(b, acquirer.Options{})
		keys, err := httpapi.ParseKeys("demo:" + apitest.APIKey)
		if err != nil {
			b.Fatal(err)
		}
		eng := engine.New(replaycache.New(store, replaycache.Options{}), sim, engine.Options{})
		h := httpapi.New(httpapi.Config{Engine: eng, Store: store, Keys: keys})
		var seq atomic.Int64
		post := func(path, key, body string) *httptest.ResponseRecorder {
			r := httptest.NewRequestWithContext(context.Background(), "POST", path, strings.NewReader(body))
			r.Header.Set("Authorization", "Bearer "+apitest.APIKey)
			r.Header.Set("Idempotency-Key", key)
			r.Header.Set("Content-Type", "application/json")
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			return w
		}
		newCharge := func(amount int64) *httptest.ResponseRecorder {
			n := seq.Add(1)
			return post("/v1/charges", fmt.Sprintf("bench-charge-%d", n),
				fmt.Sprintf(`{"order_id": %d, "amount_cents": %d, "currency": "BRL", "payment_token": "tok_ok"}`, n, amount))
		}
		var charges []string
		for range 256 {
			w := newCharge(1 << 40)
			var ch struct{ ID string }
			if w.Code != 201 || json.Unmarshal(w.Body.Bytes(), &ch) != nil {
				b.Fatalf("charge: %d %s", w.Code, w.Body)
			}
			charges = append(charges, ch.ID)
		}
		b.Run(kind+"/new-charge", func(b *testing.B) {
			b.SetParallelism(8) // 16 clients on 2 cores
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if w := newCharge(25000); w.Code != 201 {
						b.Fatalf("charge: %d %s", w.Code, w.Body)
					}
				}
			})
		})
		b.Run(kind+"/refund", func(b *testing.B) {
			b.SetParallelism(8)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					n := seq.Add(1)
					if w := post("/v1/charges/"+charges[n%int64(len(charges))]+"/refunds", fmt.Sprintf("bench-refund-%d", n), `{"amount_cents": 1}`); w.Code != 201 {
						b.Fatalf("refund: %d %s", w.Code, w.Body)
					}
				}
			})
		})
	}
}
