package recovery_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/internal/apitest"
	"github.com/chargeonce/chargeonce/recovery"
)

// TestSweeperDeletesExpiredKeysKeepsCharges: records past --key-ttl are
// deleted in batches, their charges stay, a record still processing is never
// deleted (recovery owes it an answer), and a key reused after expiry is a
// new intent with a new charge.
func TestSweeperDeletesExpiredKeysKeepsCharges(t *testing.T) {
	t.Parallel()
	const ttl = 300 * time.Millisecond
	e := setup(t, nil, engine.Options{KeyTTL: ttl})
	type intent struct {
		key string
		req *chargeonce.ChargeRequest
		id  string
	}
	var intents []intent
	for i := range 5 {
		in := intent{key: fmt.Sprintf("k-%d", i), req: request("tok_ok")}
		resp, err := e.eng.Charge(t.Context(), "demo", in.key, in.req)
		if err != nil || resp.Status != 201 {
			t.Fatalf("charge %s: %d %s, %v", in.key, resp.Status, resp.Body, err)
		}
		in.id = get(t, e.store, in.key).Charge.ID
		intents = append(intents, in)
	}
	// An orphan past its expiry too: processing, so never swept.
	e.acq.down.Store(true)
	stuck := request("tok_ok")
	if resp, err := e.eng.Charge(t.Context(), "demo", "stuck", stuck); err != nil || resp.Status != 202 {
		t.Fatalf("stuck charge: %d, %v", resp.Status, err)
	}
	e.acq.down.Store(false)
	time.Sleep(ttl + 100*time.Millisecond)

	s := recovery.NewSweeper(e.store, recovery.SweeperOptions{Batch: 2})
	n, err := s.RunOnce(t.Context())
	if err != nil || n != len(intents) {
		t.Fatalf("RunOnce deleted %d, %v; want %d", n, err, len(intents))
	}
	if n, err := s.RunOnce(t.Context()); err != nil || n != 0 {
		t.Fatalf("second RunOnce deleted %d, %v; want 0", n, err)
	}
	for _, in := range intents {
		if _, err := e.store.KeyGet(t.Context(), "demo", in.key); chargeonce.ErrorCode(err) != chargeonce.ENOTFOUND {
			t.Errorf("%s: KeyGet after sweep: %v; want ENOTFOUND", in.key, err)
		}
		ch, err := e.store.ChargeGet(t.Context(), "demo", in.id)
		if err != nil || ch.Status != chargeonce.StatusCaptured {
			t.Errorf("%s: charge %s after sweep: %+v, %v; want kept, captured", in.key, in.id, ch, err)
		}
	}
	if rec := get(t, e.store, "stuck"); rec.State != chargeonce.KeyProcessing {
		t.Fatalf("the processing record is %s", rec.State)
	}

	// Reuse after expiry: a new intent, a new charge, not a replay.
	in := intents[0]
	resp, err := e.eng.Charge(t.Context(), "demo", in.key, in.req)
	if err != nil || resp.Status != 201 || resp.Replayed {
		t.Fatalf("reuse after expiry: %d (replayed %v) %s, %v; want a fresh 201", resp.Status, resp.Replayed, resp.Body, err)
	}
	charges, err := e.store.ChargesListByOrder(t.Context(), "demo", in.req.OrderID)
	if err != nil || len(charges) != 2 || charges[0].ID == in.id || charges[1].ID != in.id {
		t.Fatalf("charges of the reused key's order: %+v, %v; want the new one and the old one", charges, err)
	}
}

// TestSweeperStartStop: the background sweeper deletes expired keys on its
// own and stops when told.
func TestSweeperStartStop(t *testing.T) {
	t.Parallel()
	e := setup(t, nil, engine.Options{KeyTTL: 100 * time.Millisecond})
	req := request("tok_ok")
	if resp, err := e.eng.Charge(t.Context(), "demo", "k", req); err != nil || resp.Status != 201 {
		t.Fatalf("charge: %d, %v", resp.Status, err)
	}
	var logs apitest.Buffer
	s := recovery.NewSweeper(e.store, recovery.SweeperOptions{Every: 20 * time.Millisecond, Logger: newLogger(&logs)})
	s.Start(t.Context())
	defer s.Stop()
	apitest.Eventually(t, 10*time.Second, "the expired key to be swept", func() bool {
		_, err := e.store.KeyGet(t.Context(), "demo", "k")
		return chargeonce.ErrorCode(err) == chargeonce.ENOTFOUND
	})
	s.Stop()
	s.Stop()
	apitest.Eventually(t, time.Second, "the sweep to be logged", func() bool {
		return contains(logs.String(), `msg="expired idempotency keys deleted" deleted=1`)
	})
}
