package postgres

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
)

// Refunds share the group commit with charges: concurrent refunds, their
// completions and new charges go in batches; a refund of more than remains
// is refused without failing the batch it ran in; and every charge's
// refunded amount is the sum of its refunds that did not fail.
func TestRefundsShareGroupCommit(t *testing.T) {
	t.Parallel()
	s := setupBatch(t)
	const (
		charges = 4
		rounds  = 6
		clients = 24
	)
	var ids []string
	for i := range charges {
		p := intent(fmt.Sprintf("captured-%d", i))
		p.Charge.AmountCents = 1000
		insertOK(t, s, p)
		if err := s.KeyComplete(t.Context(), chargeonce.KeyCompleteParams{
			MerchantID: "m1", Key: p.Charge.IdempotencyKey, Token: p.Token, ChargeStatus: chargeonce.StatusCaptured,
			ResponseStatus: 201, ResponseBody: []byte(`{}`), TTL: time.Hour,
		}); err != nil {
			t.Fatalf("capturing: %v", err)
		}
		ids = append(ids, p.Charge.ID)
	}
	failedBefore := s.batches.failed.Load()
	var refundsBatched atomic.Int64 // refunds' statements that ran in a batch
	run := s.batches.run
	s.batches.run = func(ctx context.Context, batch []job) error {
		for _, j := range batch {
			switch j := j.(type) {
			case *refundInsertJob:
				refundsBatched.Add(1)
			case *completeJob:
				if j.p.Kind == chargeonce.KindRefund {
					refundsBatched.Add(1)
				}
			}
		}
		return run(ctx, batch)
	}
	refused := 0
	for round := range rounds {
		var (
			wg sync.WaitGroup
			mu sync.Mutex
		)
		for c := range clients {
			wg.Go(func() {
				if c%3 == 0 { // a new charge, in the same batches
					insertOK(t, s, intent(fmt.Sprintf("charge-%d-%d", round, c)))
					return
				}
				amount := int64(1 + c%5)
				if c%7 == 1 {
					amount = 5000 // more than was captured
				}
				key := fmt.Sprintf("refund-%d-%d", round, c)
				p := chargeonce.RefundInsertParams{
					Fingerprint: "fp_" + key, Token: "tok_" + key, Lease: time.Hour,
					Refund: chargeonce.Refund{ID: "re_" + key, MerchantID: "m1", IdempotencyKey: key,
						ChargeID: ids[c%charges], AmountCents: amount},
				}
				rec, inserted, err := s.RefundInsert(t.Context(), p)
				if amount == 5000 {
					if chargeonce.ErrorCode(err) != chargeonce.EREFUNDEXCEEDS {
						t.Errorf("refund of 5000 of a 1000 capture: inserted %v, %v; want EREFUNDEXCEEDS", inserted, err)
					}
					mu.Lock()
					refused++
					mu.Unlock()
					return
				}
				if err != nil || !inserted || rec.Refund == nil || rec.Refund.ID != p.Refund.ID {
					t.Errorf("refund %s: inserted %v, %+v, %v", key, inserted, rec.Refund, err)
					return
				}
				// Half succeed, a quarter fail (giving their amount back),
				// each completion in the batches too.
				status := chargeonce.RefundSucceeded
				if c%4 == 2 {
					status = chargeonce.RefundFailed
				}
				if c%2 == 0 {
					if err := s.KeyComplete(t.Context(), chargeonce.KeyCompleteParams{
						Kind: chargeonce.KindRefund, MerchantID: "m1", Key: key, Token: p.Token,
						RefundStatus: status, ResponseStatus: 201, ResponseBody: []byte(`{}`), TTL: time.Hour,
					}); err != nil {
						t.Errorf("completing refund %s: %v", key, err)
					}
				}
			})
		}
		wg.Wait()
		if t.Failed() {
			t.FailNow()
		}
	}
	if refused == 0 {
		t.Fatal("no over-refund was tried")
	}
	var total int64
	for _, id := range ids {
		var refunded, sum int64
		if err := s.pool.QueryRow(t.Context(), `
			SELECT c.refunded_cents, (SELECT COALESCE(sum(amount_cents), 0) FROM refunds r WHERE r.charge_id = c.id AND r.status <> 'failed')
			FROM charges c WHERE c.id = $1`, id).Scan(&refunded, &sum); err != nil {
			t.Fatal(err)
		}
		if refunded != sum {
			t.Fatalf("charge %s: refunded_cents %d, its refunds not failed sum to %d", id, refunded, sum)
		}
		total += refunded
	}
	if total == 0 {
		t.Fatal("no refund was counted against its charge")
	}
	if refundsBatched.Load() == 0 {
		t.Fatal("no refund's insert or completion ran in a batch")
	}
	if got := s.batches.failed.Load() - failedBefore; got != 0 {
		t.Fatalf("%d batches failed: a refused over-refund must not fail the batch it ran in", got)
	}
}

// A batch of refunds that all succeeded gives nothing back, so its
// statement does not touch charges (an UPDATE of no row still fires the
// settlement events' statement trigger); one failed or canceled refund in
// it makes the batch give amounts back. TestRefundsShareGroupCommit checks
// what the statements write.
func TestRefundCompletionsTouchChargesOnlyToGiveBack(t *testing.T) {
	t.Parallel()
	job := func(status chargeonce.RefundStatus) *completeJob {
		return &completeJob{p: chargeonce.KeyCompleteParams{Kind: chargeonce.KindRefund, RefundStatus: status}}
	}
	succeeded, failed, canceled := job(chargeonce.RefundSucceeded), job(chargeonce.RefundFailed), job(chargeonce.RefundCanceled)
	for _, tc := range []struct {
		jobs []*completeJob
		want string
	}{
		{[]*completeJob{succeeded, succeeded}, refundSucceedBatchSQL},
		{[]*completeJob{succeeded, failed}, refundCompleteBatchSQL},
		{[]*completeJob{canceled, succeeded}, refundCompleteBatchSQL},
	} {
		if got := refundCompleteBatchStatement(tc.jobs); got != tc.want {
			t.Errorf("%d jobs, first %s: got the other statement", len(tc.jobs), tc.jobs[0].p.RefundStatus)
		}
	}
	if strings.Contains(refundSucceedBatchSQL, "charges") || strings.Contains(refundSucceedSQL, "charges") {
		t.Error("a statement completing succeeded refunds names charges")
	}
	for _, s := range []chargeonce.RefundStatus{chargeonce.RefundFailed, chargeonce.RefundCanceled} {
		if refundCompleteStatement(s) != refundCompleteSQL {
			t.Errorf("a %s refund completes without giving its amount back", s)
		}
	}
}
