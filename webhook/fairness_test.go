package webhook_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/idempotency"
	"github.com/chargeonce/chargeonce/internal/apitest"
	"github.com/chargeonce/chargeonce/webhook"
)

// TestDeadReceiversFairness (issue 48, item 3): four merchants, each with
// 16 endpoints (max_concurrency 8) on a receiver that accepts and never
// answers, have 640 deliveries due each; a sender with the default 512
// workers sends what it can to them. Another merchant's delivery still
// arrives while every one of those requests is held, not once the first
// of them times out (15 s): a reserve of the workers is left to merchants
// with nothing in flight. Seen before: the four took all 512 workers and
// the other merchant's delivery waited for their timeouts (up to 28 s).
func TestDeadReceiversFairness(t *testing.T) {
	t.Parallel()
	f := setup(t)
	hole := apitest.NewBlackHole(t)
	const dead, endpoints, events = 4, 16, 40
	for m := range dead {
		merchant := fmt.Sprintf("dead-%d", m)
		for j := range endpoints {
			if _, err := f.store.WebhookEndpointCreate(t.Context(), chargeonce.WebhookEndpoint{
				ID: "we_" + idempotency.NewToken(), MerchantID: merchant, URL: fmt.Sprintf("%s/%s/%d", hole.URL, merchant, j),
				Secret: webhook.NewSecret(), MaxConcurrency: 8,
			}); err != nil {
				t.Fatal(err)
			}
		}
		for range events {
			f.settle(t, merchant, chargeonce.StatusCaptured)
		}
	}
	live := newReceiver(t, nil)
	le := f.endpoint(t, "live", live.srv.URL)
	live.setSecrets(le.Secret)

	s := f.sender(t, webhook.SenderOptions{Scale: 1})
	s.Start(t.Context())
	defer s.Stop()
	// The dead receivers hold what the sender gives them: all but the
	// reserve (512 before).
	eventually(t, 30*time.Second, "the dead receivers holding the sender's workers", func() bool {
		return hole.Held() >= webhook.DefaultWorkers*7/8
	})
	time.Sleep(200 * time.Millisecond) // what more the sender would give them
	held := hole.Held()
	start := time.Now()
	f.settle(t, "live", chargeonce.StatusCaptured)
	eventually(t, 30*time.Second, "the live merchant's delivery", func() bool { return len(live.deliveries()) >= 1 })
	took := time.Since(start)
	t.Logf("the live merchant's delivery arrived in %s while the dead receivers held %d requests (%d released meanwhile)",
		took.Round(time.Millisecond), held, hole.Released.Load())
	if r := hole.Released.Load(); r > 0 {
		t.Fatalf("the live merchant's delivery arrived after %d of the dead receivers' requests timed out (in %s): it waited for their workers", r, took)
	}
	if took >= time.Second {
		t.Errorf("the live merchant's delivery took %s while the dead receivers held %d requests; want under 1 s", took, held)
	}
}
