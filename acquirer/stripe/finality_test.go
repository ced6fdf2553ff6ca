package stripe_test

import (
	"testing"
	"time"

	stripego "github.com/stripe/stripe-go/v82"

	"github.com/chargeonce/chargeonce/acquirer/stripe"
)

// TestAcceptanceWindowFollowsStripeGoRetries (SPEC "Finality"): Stripe's
// window is what stripe-go's timeout and retries allow a request we sent:
// (1 + retries) attempts of 80 s and the 5 s pauses between them.
func TestAcceptanceWindowFollowsStripeGoRetries(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		retries *int64
		want    time.Duration
	}{{nil, 250 * time.Second}, {stripego.Int64(0), 80 * time.Second}, {stripego.Int64(5), 505 * time.Second}} {
		a, err := stripe.New(stripe.Options{Key: "sk_test_x", MaxNetworkRetries: c.retries})
		if err != nil {
			t.Fatal(err)
		}
		if got := a.AcceptanceWindow(); got != c.want {
			t.Errorf("retries %v: window %s, want %s", c.retries, got, c.want)
		}
	}
}
