package webhook_test

import (
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
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
		cur, peak atomic.Int64
		mu        sync.Mutex
		got       map[string]int
	}
	serve := func(c *counter) *httptest.Server {
		c.got = map[string]int{}
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n := c.cur.Add(1)
			for p := c.peak.Load(); n > p && !c.peak.CompareAndSwap(p, n); p = c.peak.Load() {
			}
			time.Sleep(20 * time.Millisecond)
			c.mu.Lock()
			c.got[r.Header.Get("webhook-id")]++
			c.mu.Unlock()
			c.cur.Add(-1)
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
	t.Logf("peak requests in flight: %d (max_concurrency 3), %d (default %d)", three.peak.Load(), dflt.peak.Load(), chargeonce.DefaultEndpointConcurrency)
	if p := three.peak.Load(); p > 3 {
		t.Fatalf("an endpoint with max_concurrency 3 had %d requests in flight", p)
	}
	if p := dflt.peak.Load(); p > chargeonce.DefaultEndpointConcurrency || p <= 3 {
		t.Fatalf("an endpoint with the default concurrency had at most %d requests in flight, want 4 to %d", p, chargeonce.DefaultEndpointConcurrency)
	}
}
