package webhook

import (
	"context"
	"encoding/json"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/idempotency"
)

// Tester sends test events (POST /v1/webhook_endpoints/{id}/test): a
// webhook.test event, signed like any delivery, sent once at once through
// the same guarded client, and never recorded or retried.
type Tester struct {
	s *Sender
}

// NewTester returns a Tester; allowPrivate as for SenderOptions.
func NewTester(allowPrivate bool) *Tester {
	return &Tester{s: &Sender{o: SenderOptions{AllowPrivate: allowPrivate, Scale: 1}, client: newClient(allowPrivate, 1)}}
}

// Send delivers a test event to e and returns the event's id and how the
// attempt went (its error redacted, as a delivery's).
func (t *Tester) Send(ctx context.Context, e chargeonce.WebhookEndpoint) (string, chargeonce.WebhookAttempt) {
	id := "evt_test_" + idempotency.NewToken()[:24]
	now := time.Now()
	body, _ := json.Marshal(map[string]any{ // a map of strings always encodes
		"id": id, "type": chargeonce.EventTest, "created_at": now.UTC().Format(time.RFC3339Nano),
		"data": map[string]any{"object": map[string]any{"object": "webhook_endpoint", "id": e.ID}},
	})
	d := chargeonce.WebhookDelivery{Event: chargeonce.WebhookEvent{ID: id, MerchantID: e.MerchantID, Type: chargeonce.EventTest, CreatedAt: now}, Endpoint: e}
	o := t.s.attempt(ctx, d, body)
	o.Attempt.At = now
	return id, o.Attempt
}
