package webhook_test

import (
	"context"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/internal/apitest"
	"github.com/chargeonce/chargeonce/webhook"
)

// emptyClaims is a store that counts the claims in a row that found
// nothing: each one doubles the sender's next wait, from 20 ms after the
// first to 10 ms × 2^n after the nth.
type emptyClaims struct {
	chargeonce.Store
	n atomic.Int64
}

func (s *emptyClaims) WebhookDeliveriesClaim(ctx context.Context, lease time.Duration, limit, perMerchant int, skip []string) ([]chargeonce.WebhookDelivery, error) {
	ds, err := s.Store.WebhookDeliveriesClaim(ctx, lease, limit, perMerchant, skip)
	if len(ds) == 0 {
		s.n.Add(1)
	} else {
		s.n.Store(0)
	}
	return ds, err
}

// TestSettlementNudgesIdleSender: a sender that has gone quiet backs its
// polls off towards Every (an hour here); a charge the engine settles for a
// merchant it delivered to lately wakes it (engine.Options.Settled →
// Sender.Nudge), and the delivery arrives long before the next poll. A
// merchant it never delivered to does not wake it: that charge's delivery
// waits for the poll. The test waits for the sender's ninth empty claim in
// a row, after which it sleeps 5.12 s whatever the machine's load.
func TestSettlementNudgesIdleSender(t *testing.T) {
	t.Parallel()
	f := setup(t)
	rcv := newReceiver(t, nil)
	e := f.endpoint(t, "nudged", rcv.srv.URL)
	other := f.endpoint(t, "quiet", rcv.srv.URL)
	rcv.setSecrets(e.Secret, other.Secret)
	store := &emptyClaims{Store: f.store}
	s := webhook.NewSender(store, webhook.SenderOptions{Every: time.Hour, AllowPrivate: true,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	eng := engine.New(f.store, apitest.Simulator(t, acquirer.Options{}), engine.Options{Settled: s.Nudge})
	charge := func(merchant, key string) {
		t.Helper()
		resp, err := eng.Charge(t.Context(), merchant, key, &chargeonce.ChargeRequest{OrderID: 1, AmountCents: 500, Currency: "BRL", PaymentToken: "tok_ok"})
		if err != nil || resp.Status != 201 {
			t.Fatalf("charge %s: %d %s %v", key, resp.Status, resp.Body, err)
		}
	}
	charge("nudged", "first")
	s.Start(t.Context())
	t.Cleanup(s.Stop)
	eventually(t, 10*time.Second, "the first delivery (the sender's first poll)", func() bool { return len(rcv.deliveries()) == 1 })
	eventually(t, 30*time.Second, "the sender's ninth empty claim in a row", func() bool { return store.n.Load() >= 9 })
	// A settlement of a merchant the sender has not delivered to does not
	// wake it: nothing is claimed until the poll, 5.12 s away.
	charge("quiet", "second")
	time.Sleep(500 * time.Millisecond)
	if n := len(rcv.deliveries()); n != 1 {
		t.Fatalf("%d deliveries: a merchant the sender has not delivered to woke it", n)
	}
	// One of the merchant it delivered to does: its delivery (and the
	// quiet merchant's, claimed with it) arrive before the next poll.
	start := time.Now()
	charge("nudged", "third")
	eventually(t, 3*time.Second, "the deliveries after the nudge, before the sender's next poll", func() bool { return len(rcv.deliveries()) == 3 })
	t.Logf("settlement → delivery with the sender idle: %s", time.Since(start).Round(time.Millisecond))
}
