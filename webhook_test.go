package chargeonce_test

import (
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
)

// TestWebhookOutcomeDisables is the endpoint disable rule's table, the one
// both stores' WebhookDeliveryFinish apply.
func TestWebhookOutcomeDisables(t *testing.T) {
	t.Parallel()
	const (
		enabled  = chargeonce.EndpointEnabled
		disabled = chargeonce.EndpointDisabled
	)
	day := 24 * time.Hour
	gone := chargeonce.WebhookOutcome{Disable: "the endpoint answered 410 Gone"}
	failed := chargeonce.WebhookOutcome{RetryIn: time.Minute, DisableAfter: day}
	for _, c := range []struct {
		name        string
		o           chargeonce.WebhookOutcome
		status      chargeonce.EndpointStatus
		failingLong bool
		disable     bool
		reason      string
	}{
		{"a 410 disables at once", gone, enabled, false, true, "the endpoint answered 410 Gone"},
		{"a 410 names its own reason", withAfter(gone, day), enabled, true, true, "the endpoint answered 410 Gone"},
		{"a failure, the clock short", failed, enabled, false, false, ""},
		{"a failure, the clock run out", failed, enabled, true, true, "no 2xx for 24h0m0s"},
		{"a last failure, the clock run out", chargeonce.WebhookOutcome{DisableAfter: time.Hour}, enabled, true, true, "no 2xx for 1h0m0s"},
		{"no DisableAfter, no clock", withAfter(failed, 0), enabled, true, false, ""},
		{"a negative DisableAfter, no clock", withAfter(failed, -time.Second), enabled, true, false, ""},
		{"disabled already, a 410", gone, disabled, false, false, ""},
		{"disabled already, the clock run out", failed, disabled, true, false, ""},
		{"delivered", chargeonce.WebhookOutcome{Delivered: true, DisableAfter: day}, enabled, true, false, ""},
	} {
		disable, reason := c.o.Disables(c.status, c.failingLong)
		if disable != c.disable || reason != c.reason {
			t.Errorf("%s: Disables = %v, %q; want %v, %q", c.name, disable, reason, c.disable, c.reason)
		}
	}
}

func withAfter(o chargeonce.WebhookOutcome, after time.Duration) chargeonce.WebhookOutcome {
	o.DisableAfter = after
	return o
}
