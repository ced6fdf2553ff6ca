package recovery_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/internal/apitest"
	"github.com/chargeonce/chargeonce/recovery"
)

// writeCounter counts the calls of the store's methods that write an
// operation or its record, and calls onInsert after every
// OperationInsert.
type writeCounter struct {
	chargeonce.Store
	inserts, writes atomic.Int64
	onInsert        func(n int64)
}

func (w *writeCounter) OperationInsert(ctx context.Context, p chargeonce.OperationInsertParams) (chargeonce.KeyRecord, bool, error) {
	n := w.inserts.Add(1)
	w.writes.Add(1)
	if w.onInsert != nil {
		w.onInsert(n)
	}
	return w.Store.OperationInsert(ctx, p)
}

func (w *writeCounter) KeyComplete(ctx context.Context, p chargeonce.KeyCompleteParams) error {
	w.writes.Add(1)
	return w.Store.KeyComplete(ctx, p)
}

func (w *writeCounter) KeyClaim(ctx context.Context, merchantID, key, token string, lease time.Duration) (chargeonce.KeyRecord, bool, error) {
	w.writes.Add(1)
	return w.Store.KeyClaim(ctx, merchantID, key, token, lease)
}

func (w *writeCounter) KeyLeaseSet(ctx context.Context, merchantID, key, token string, d time.Duration, recoveryAttempt bool) error {
	w.writes.Add(1)
	return w.Store.KeyLeaseSet(ctx, merchantID, key, token, d, recoveryAttempt)
}

// TestExpiryPassIsBounded (issue 47.6): expired authorizations whose voids
// the acquirer refuses (each was captured there outside chargeonce) are
// each tried once by the sweeper's first pass, and never again: the next
// passes write nothing and call the acquirer for nothing. The old sweeper
// counted a replayed failed void as begun and listed the same batch again
// for ever (one pass never ended while more than a batch were expired, and
// each later pass replayed every one of them).
func TestExpiryPassIsBounded(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"postgres", "sqlite"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			const n, batch = 300, 40
			store := &writeCounter{Store: apitest.Store(t, kind)}
			sim := apitest.Simulator(t, acquirer.Options{})
			eng := engine.New(store, sim, engine.Options{Lease: 30 * time.Second, AcquirerTimeout: 5 * time.Second})
			for i := range n {
				key := fmt.Sprintf("expiring-%d", i)
				resp, err := eng.Charge(t.Context(), "demo", key, manualRequest("tok_ok"))
				if err != nil || resp.Status != 201 {
					t.Fatalf("manual charge %d: %d %s, %v", i, resp.Status, resp.Body, err)
				}
				ch := get(t, store, key).Charge
				res, err := sim.CaptureAuthorized(t.Context(), chargeonce.OperationCall{
					Reference: fmt.Sprintf("cp_outside_%s", ch.ID), ChargeReference: ch.ID,
					Merchant: "demo", AmountCents: ch.AmountCents, Currency: ch.Currency,
				})
				if err != nil || res.Status != chargeonce.OperationSucceeded {
					t.Fatalf("capturing %s at the acquirer outside chargeonce: %+v, %v", ch.ID, res, err)
				}
			}
			time.Sleep(20 * time.Millisecond)

			// A pass that tries more than every authorization twice never
			// ends: cancel it rather than hang.
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			store.onInsert = func(inserts int64) {
				if inserts > 2*n {
					cancel()
				}
			}
			s := recovery.NewSweeper(store, recovery.SweeperOptions{Canceler: eng, AuthorizationTTL: time.Millisecond, Batch: batch})
			voids := sim.Stats().OperationRequests
			first, err := s.ExpireOnce(ctx)
			if err != nil {
				t.Fatalf("the first pass did not end: %v after %d cancels begun or replayed for %d authorizations", err, store.inserts.Load(), n)
			}
			// What the sweep logs: none canceled, every one failed.
			if first != (recovery.ExpiryPass{Failed: n}) {
				t.Fatalf("the first pass counted %+v; want %d failed and nothing canceled", first, n)
			}
			if got := store.inserts.Load(); got != n {
				t.Fatalf("the first pass tried %d cancels for %d expired authorizations; want each once", got, n)
			}
			if got := sim.Stats().OperationRequests - voids; got != n {
				t.Fatalf("the first pass sent %d voids for %d authorizations; want each once", got, n)
			}
			for pass := 2; pass <= 4; pass++ {
				writes, inserts, voids := store.writes.Load(), store.inserts.Load(), sim.Stats().OperationRequests
				if p, err := s.ExpireOnce(ctx); err != nil || p.Tried() != 0 {
					t.Fatalf("pass %d: %+v, %v; want nothing tried", pass, p, err)
				}
				if w, i, v := store.writes.Load()-writes, store.inserts.Load()-inserts, sim.Stats().OperationRequests-voids; w != 0 || i != 0 || v != 0 {
					t.Fatalf("pass %d after the voids failed: %d writes, %d cancels begun or replayed, %d voids sent; want no work", pass, w, i, v)
				}
			}
			// Our books still say authorized (the acquirer refused every
			// void): an operator's to settle, not the sweeper's.
			for _, i := range []int{0, n - 1} {
				if ch := get(t, store, fmt.Sprintf("expiring-%d", i)).Charge; ch.Status != chargeonce.StatusAuthorized {
					t.Fatalf("charge %s is %s after its void failed; want authorized", ch.ID, ch.Status)
				}
			}
		})
	}
}
