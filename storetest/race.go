package storetest

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
)

// testRaceManyKeys is the new-charge path under load: many attempts on many
// keys at once, several per key (some with another request, so another
// fingerprint), the same key names under two merchants, then every attempt
// completing at once, owners and losers alike. A store that coalesces
// concurrent writes into shared statements (PostgreSQL's group commit)
// gets many keys and duplicates of a key into one batch here; each attempt
// must still get exactly what a statement of its own would give it.
func testRaceManyKeys(t *testing.T, s chargeonce.Store) {
	const (
		keys    = 24
		perKey  = 6
		rounds  = 2
		orderID = 7000
	)
	merchants := []string{"m1", "m2"}
	type attempt struct {
		p        chargeonce.KeyInsertParams
		rec      chargeonce.KeyRecord
		inserted bool
		err      error
		cerr     error
	}
	for round := range rounds {
		var attempts []*attempt
		for k := range keys {
			for _, m := range merchants {
				fp := "fp_" + randHex(8)
				for i := range perKey {
					p := newIntent(m, fmt.Sprintf("many-%d-%d", round, k))
					p.Charge.OrderID = int64(orderID + round*keys + k)
					p.Fingerprint = fp
					if i%3 == 2 {
						p.Fingerprint = "fp_other_" + randHex(8) // same key, another request
					}
					attempts = append(attempts, &attempt{p: p})
				}
			}
		}
		start := make(chan struct{})
		var wg sync.WaitGroup
		for _, a := range attempts {
			wg.Go(func() {
				<-start
				a.rec, a.inserted, a.err = s.KeyInsert(t.Context(), a.p)
			})
		}
		close(start)
		wg.Wait()

		winners := map[string]*attempt{}
		for _, a := range attempts {
			if a.err != nil {
				t.Fatalf("round %d: KeyInsert(%s/%s): %v", round, a.p.Charge.MerchantID, a.p.Charge.IdempotencyKey, a.err)
			}
			id := a.p.Charge.MerchantID + "/" + a.p.Charge.IdempotencyKey
			if a.inserted {
				if w := winners[id]; w != nil {
					t.Fatalf("round %d: %s has two winners: tokens %s and %s", round, id, w.p.Token, a.p.Token)
				}
				winners[id] = a
			}
		}
		if len(winners) != keys*len(merchants) {
			t.Fatalf("round %d: %d keys won, want %d (one per merchant and key)", round, len(winners), keys*len(merchants))
		}
		for _, a := range attempts {
			w := winners[a.p.Charge.MerchantID+"/"+a.p.Charge.IdempotencyKey]
			r := a.rec
			if r.MerchantID != a.p.Charge.MerchantID || r.Key != a.p.Charge.IdempotencyKey ||
				r.Token != w.p.Token || r.Fingerprint != w.p.Fingerprint || r.Charge.ID != w.p.Charge.ID ||
				r.State != chargeonce.KeyProcessing || r.LeaseExpired || r.LeaseRemaining <= 0 {
				t.Fatalf("round %d: attempt %s/%s (token %s) got record %s/%s token %s fp %s charge %s state %s lease expired %v; want the winner's token %s fp %s charge %s, processing",
					round, a.p.Charge.MerchantID, a.p.Charge.IdempotencyKey, a.p.Token, r.MerchantID, r.Key, r.Token, r.Fingerprint, r.Charge.ID, r.State, r.LeaseExpired,
					w.p.Token, w.p.Fingerprint, w.p.Charge.ID)
			}
			checkCharge(t, "the record's charge", r.Charge, w.p.Charge, chargeonce.StatusProcessing, "")
		}

		// Everybody completes at once: only the owners' compare-and-sets
		// may succeed, each on its own record.
		start = make(chan struct{})
		for i, a := range attempts {
			status := chargeonce.StatusCaptured
			if i%2 == 1 {
				status = chargeonce.StatusDeclined
			}
			wg.Go(func() {
				<-start
				a.cerr = s.KeyComplete(t.Context(), chargeonce.KeyCompleteParams{
					MerchantID: a.p.Charge.MerchantID, Key: a.p.Charge.IdempotencyKey, Token: a.p.Token,
					ChargeStatus: status, DeclineCode: map[bool]string{true: "insufficient_funds"}[status == chargeonce.StatusDeclined],
					ResponseStatus: 201, ResponseBody: []byte(a.p.Token), TTL: longTTL,
				})
			})
		}
		close(start)
		wg.Wait()
		for _, a := range attempts {
			if a.inserted {
				if a.cerr != nil {
					t.Fatalf("round %d: the owner's KeyComplete(%s/%s): %v", round, a.p.Charge.MerchantID, a.p.Charge.IdempotencyKey, a.cerr)
				}
				continue
			}
			wantCode(t, fmt.Sprintf("round %d: a loser's KeyComplete(%s/%s)", round, a.p.Charge.MerchantID, a.p.Charge.IdempotencyKey), a.cerr, chargeonce.ESTALE)
		}
		for id, w := range winners {
			rec := get(t, s, w.p.Charge.MerchantID, w.p.Charge.IdempotencyKey)
			if rec.State != chargeonce.KeyCompleted || string(rec.ResponseBody) != w.p.Token || rec.Token != w.p.Token {
				t.Fatalf("round %d: %s is %s with body %q, want completed with the owner's body %q", round, id, rec.State, rec.ResponseBody, w.p.Token)
			}
			if rec.Charge.Status == chargeonce.StatusProcessing {
				t.Fatalf("round %d: %s completed but its charge is still processing", round, id)
			}
			charges, err := s.ChargesListByOrder(t.Context(), w.p.Charge.MerchantID, w.p.Charge.OrderID)
			if err != nil {
				t.Fatalf("round %d: ChargesListByOrder: %v", round, err)
			}
			if len(charges) != 1 || charges[0].ID != w.p.Charge.ID || charges[0].Status != rec.Charge.Status {
				t.Fatalf("round %d: %s has %d charges, want only the owner's %s", round, id, len(charges), w.p.Charge.ID)
			}
		}
	}
}

// testRaceInsertsWithCompletions is the new-charge path as clients drive it:
// on every key many attempts race, the winner completes at once while the
// losers keep retrying, so inserts and completions of the same keys arrive
// together. A store that commits concurrent inserts and completions in one
// transaction (PostgreSQL's group commit) gets them in the same batches
// here; every attempt must still see what statements of its own would show:
// one winner per key, its completion applied once, and every retry finding
// the winner's record, processing and then completed with the winner's
// answer.
func testRaceInsertsWithCompletions(t *testing.T, s chargeonce.Store) {
	const (
		keys    = 16
		perKey  = 8
		rounds  = 3
		orderID = 9000
	)
	for round := range rounds {
		type attempt struct {
			p     chargeonce.KeyInsertParams
			won   bool
			final chargeonce.KeyRecord
			err   error
		}
		var attempts []*attempt
		for k := range keys {
			for range perKey {
				p := newIntent("m1", fmt.Sprintf("mixed-%d-%d", round, k))
				p.Charge.OrderID = int64(orderID + round*keys + k)
				p.Fingerprint = "fp_mixed"
				attempts = append(attempts, &attempt{p: p})
			}
		}
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for _, a := range attempts {
			wg.Go(func() {
				<-start
				for ctx.Err() == nil {
					rec, inserted, err := s.KeyInsert(ctx, a.p)
					if err != nil {
						a.err = fmt.Errorf("KeyInsert: %w", err)
						return
					}
					if inserted {
						a.won = true
						if err := s.KeyComplete(ctx, chargeonce.KeyCompleteParams{
							MerchantID: a.p.Charge.MerchantID, Key: a.p.Charge.IdempotencyKey, Token: a.p.Token,
							ChargeStatus: chargeonce.StatusCaptured, ResponseStatus: 201, ResponseBody: []byte(a.p.Token), TTL: longTTL,
						}); err != nil {
							a.err = fmt.Errorf("the owner's KeyComplete: %w", err)
							return
						}
						// Read back as the owner's next request would: an
						// attempt of its own (its own token) never comes again.
						a.final, a.err = s.KeyGet(ctx, a.p.Charge.MerchantID, a.p.Charge.IdempotencyKey)
						return
					}
					if rec.State == chargeonce.KeyCompleted {
						a.final = rec
						return
					}
					runtime.Gosched()
				}
				a.err = ctx.Err()
			})
		}
		close(start)
		wg.Wait()
		cancel()

		winners := map[string]*attempt{}
		for _, a := range attempts {
			if a.err != nil {
				t.Fatalf("round %d: %s: %v", round, a.p.Charge.IdempotencyKey, a.err)
			}
			if a.won {
				if w := winners[a.p.Charge.IdempotencyKey]; w != nil {
					t.Fatalf("round %d: %s has two winners: tokens %s and %s", round, a.p.Charge.IdempotencyKey, w.p.Token, a.p.Token)
				}
				winners[a.p.Charge.IdempotencyKey] = a
			}
		}
		if len(winners) != keys {
			t.Fatalf("round %d: %d keys won, want %d", round, len(winners), keys)
		}
		for _, a := range attempts {
			w := winners[a.p.Charge.IdempotencyKey]
			r := a.final
			if r.Token != w.p.Token || string(r.ResponseBody) != w.p.Token || r.Charge.ID != w.p.Charge.ID ||
				r.Charge.Status != chargeonce.StatusCaptured {
				t.Fatalf("round %d: attempt on %s ended with token %s body %q charge %s %s; want the winner's %s, %s captured",
					round, a.p.Charge.IdempotencyKey, r.Token, r.ResponseBody, r.Charge.ID, r.Charge.Status, w.p.Token, w.p.Charge.ID)
			}
		}
		for _, w := range winners {
			charges, err := s.ChargesListByOrder(t.Context(), w.p.Charge.MerchantID, w.p.Charge.OrderID)
			if err != nil {
				t.Fatalf("round %d: ChargesListByOrder: %v", round, err)
			}
			if len(charges) != 1 || charges[0].ID != w.p.Charge.ID || charges[0].Status != chargeonce.StatusCaptured {
				t.Fatalf("round %d: %s has %d charges, want only the owner's %s, captured", round, w.p.Charge.IdempotencyKey, len(charges), w.p.Charge.ID)
			}
		}
	}
}
