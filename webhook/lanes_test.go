package webhook_test

import (
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/idempotency"
	"github.com/chargeonce/chargeonce/webhook"
)

// TestEndpointConcurrency: two endpoints of one merchant, one with
// max_concurrency 3 and one with the default, each receive 40 deliveries
// that take 20 ms to answer: neither ever has more requests in flight
// than its concurrency, the default one does go past 3 (the deliveries are
// sent in parallel, not one at a time), and every event arrives once per
// endpoint.
func TestEndpointConcurrency(t *testing.T) {
	t.Parallel()
	f := setup(t)
	type counter struct {
		mu        sync.Mutex
		cur, peak int64
		got       map[string]int
	}
	serve := func(c *counter) *httptest.Server {
		c.got = map[string]int{}
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			c.mu.Lock()
			c.cur++
			c.peak = max(c.peak, c.cur)
			c.mu.Unlock()
			time.Sleep(20 * time.Millisecond)
			c.mu.Lock()
			c.got[r.Header.Get("webhook-id")]++
			c.cur--
			c.mu.Unlock()
			w.WriteHeader(http.StatusNoContent)
		}))
		t.Cleanup(srv.Close)
		return srv
	}
	var three, dflt counter
	if _, err := f.store.WebhookEndpointCreate(t.Context(), chargeonce.WebhookEndpoint{
		ID: "we_" + idempotency.NewToken(), MerchantID: "demo", URL: serve(&three).URL, Secret: webhook.NewSecret(), MaxConcurrency: 3,
	}); err != nil {
		t.Fatal(err)
	}
	f.endpoint(t, "demo", serve(&dflt).URL)
	const n = 40
	for range n {
		f.settle(t, "demo", chargeonce.StatusCaptured)
	}
	s := f.sender(t, webhook.SenderOptions{})
	if got := s.RunOnce(t.Context()); got != 2*n {
		t.Fatalf("RunOnce made %d deliveries, want %d", got, 2*n)
	}
	for name, c := range map[string]*counter{"max_concurrency 3": &three, "the default": &dflt} {
		if len(c.got) != n {
			t.Fatalf("%s: %d events received, want %d", name, len(c.got), n)
		}
		for id, k := range c.got {
			if k != 1 {
				t.Fatalf("%s: event %s received %d times", name, id, k)
			}
		}
	}
	t.Logf("peak requests in flight: %d (max_concurrency 3), %d (default %d)", three.peak, dflt.peak, chargeonce.DefaultEndpointConcurrency)
	if p := three.peak; p > 3 {
		t.Fatalf("an endpoint with max_concurrency 3 had %d requests in flight", p)
	}
	if p := dflt.peak; p > chargeonce.DefaultEndpointConcurrency || p <= 3 {
		t.Fatalf("an endpoint with the default concurrency had at most %d requests in flight, want 4 to %d", p, chargeonce.DefaultEndpointConcurrency)
	}
}
