package webhook

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/idempotency"
)

// MaxTestsInFlight bounds one merchant's test events under way at once,
// on each instance: each holds an outbound connection, and the API
// request that asked for it, until the receiver answers (DeliveryTimeout
// at most). Unbounded, about 21 calls a second within the routes' rate
// held 322 outbound and 334 API connections for one merchant, and a dozen
// merchants could fill the server's connections (issue 48).
const MaxTestsInFlight = 2

// Tester sends test events (POST /v1/webhook_endpoints/{id}/test): a
// webhook.test event, signed like any delivery, sent once at once through
// the same guarded client, and never recorded or retried. One merchant has
// at most MaxTestsInFlight under way; its connection is closed once
// answered (a test keeps no connection alive).
type Tester struct {
	s *Sender

	mu       sync.Mutex
	inflight map[string]int // merchant -> test events under way
}

// NewTester returns a Tester; allowPrivate as for SenderOptions.
func NewTester(allowPrivate bool) *Tester {
	c := newClient(allowPrivate, 1)
	c.Transport.(*http.Transport).DisableKeepAlives = true
	return &Tester{s: &Sender{o: SenderOptions{AllowPrivate: allowPrivate, Scale: 1}, client: c}, inflight: map[string]int{}}
}

// Send delivers a test event to e and returns the event's id and how the
// attempt went (its error redacted, as a delivery's). With
// MaxTestsInFlight of e's merchant under way it sends nothing and returns
// an ERATELIMITED error.
func (t *Tester) Send(ctx context.Context, e chargeonce.WebhookEndpoint) (string, chargeonce.WebhookAttempt, error) {
	t.mu.Lock()
	if t.inflight[e.MerchantID] >= MaxTestsInFlight {
		t.mu.Unlock()
		return "", chargeonce.WebhookAttempt{}, &chargeonce.Error{Code: chargeonce.ERATELIMITED, RetryAfter: time.Second,
			Message: fmt.Sprintf("this merchant has %d test events under way, the most at once: retry after the time in Retry-After", MaxTestsInFlight)}
	}
	t.inflight[e.MerchantID]++
	t.mu.Unlock()
	defer func() {
		t.mu.Lock()
		if t.inflight[e.MerchantID]--; t.inflight[e.MerchantID] <= 0 {
			delete(t.inflight, e.MerchantID)
		}
		t.mu.Unlock()
	}()
	id := "evt_test_" + idempotency.NewToken()[:24]
	now := time.Now()
	body, _ := json.Marshal(map[string]any{ // a map of strings always encodes
		"id": id, "type": chargeonce.EventTest, "created_at": now.UTC().Format(time.RFC3339Nano),
		"data": map[string]any{"object": map[string]any{"object": "webhook_endpoint", "id": e.ID}},
	})
	d := chargeonce.WebhookDelivery{Event: chargeonce.WebhookEvent{ID: id, MerchantID: e.MerchantID, Type: chargeonce.EventTest, CreatedAt: now}, Endpoint: e}
	o := t.s.attempt(ctx, d, body)
	o.Attempt.At = now
	return id, o.Attempt, nil
}
