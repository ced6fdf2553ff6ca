package webhook_test

import (
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/internal/apitest"
	"github.com/chargeonce/chargeonce/webhook"
)

// TestSettlementNudgesIdleSender: a sender that has gone quiet backs its
// polls off towards Every (an hour here); a charge the engine settles for a
// merchant it delivered to lately wakes it (engine.Options.Settled →
// Sender.Nudge), and the delivery arrives long before the next poll. A
// merchant it never delivered to does not wake it: that charge's delivery
// waits for the poll.
func TestSettlementNudgesIdleSender(t *testing.T) {
	t.Parallel()
	f := setup(t)
	rcv := newReceiver(t, nil)
	e := f.endpoint(t, "nudged", rcv.srv.URL)
	other := f.endpoint(t, "quiet", rcv.srv.URL)
	rcv.setSecrets(e.Secret, other.Secret)
	s := f.sender(t, webhook.SenderOptions{Every: time.Hour})
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
	// Empty polls double the wait from claimGap (10, 20, … 2560 ms, then
	// 5120): from 5.1 s to 10.2 s after the delivery the sender sleeps.
	time.Sleep(5300 * time.Millisecond)
	// A settlement of a merchant the sender has not delivered to does not
	// wake it: nothing is claimed until the poll.
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
	t.Logf("settlement → delivery after 5.8 s of quiet: %s", time.Since(start).Round(time.Millisecond))
}
