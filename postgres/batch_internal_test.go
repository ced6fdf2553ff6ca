package postgres

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/internal/pgtest"
)

// setupBatch returns a migrated store in a schema of its own.
func setupBatch(t *testing.T) *Store {
	t.Helper()
	s, err := Open(t.Context(), pgtest.URL(t), WithMaxConns(8))
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.Migrate(t.Context()); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	return s
}

func intent(key string) chargeonce.KeyInsertParams {
	return chargeonce.KeyInsertParams{
		Fingerprint: "fp_" + key,
		Token:       "tok_" + key + "_" + fmt.Sprint(time.Now().UnixNano()),
		Lease:       time.Hour,
		Charge: chargeonce.Charge{
			ID: "ch_" + key, MerchantID: "m1", IdempotencyKey: key, OrderID: 1,
			AmountCents: 100, Currency: "BRL", PaymentToken: "tok_ok",
		},
	}
}

// waitFor polls cond (under b's lock) until it holds, or fails the test.
func waitFor(t *testing.T, b *batcher, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		b.mu.Lock()
		ok := cond()
		b.mu.Unlock()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// refusePoison makes the store refuse, with its own error, the charge of
// any attempt on the key "poison".
func refusePoison(t *testing.T, s *Store) {
	t.Helper()
	if _, err := s.pool.Exec(t.Context(), `
CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'poisoned charge %', NEW.id; END $$;
CREATE TRIGGER refuse_poison BEFORE INSERT ON charges
FOR EACH ROW WHEN (NEW.idempotency_key = 'poison') EXECUTE FUNCTION refuse_poison();`); err != nil {
		t.Fatalf("creating the trigger: %v", err)
	}
}

// holdInserts makes the batcher's running batch wait: another
// transaction inserts key "blocker" and keeps it uncommitted, and an
// attempt on that key leads a batch that waits on it. Attempts made
// meanwhile queue up and go together in the next batch once release rolls
// the transaction back; wait then returns the leader's outcome.
func holdInserts(t *testing.T, s *Store) (release func(), wait func() (bool, error)) {
	t.Helper()
	tx, err := s.pool.Begin(t.Context())
	if err != nil {
		t.Fatalf("Begin: %v", err)
	}
	if _, err := tx.Exec(t.Context(), `INSERT INTO idempotency_keys
		(merchant_id, key, fingerprint, token, state, lease_until, charge_id)
		VALUES ('m1', 'blocker', 'fp', 'tok', 'processing', now(), 'ch_x')`); err != nil {
		t.Fatalf("holding the key: %v", err)
	}
	var (
		inserted bool
		lerr     error
		done     = make(chan struct{})
	)
	go func() {
		defer close(done)
		_, inserted, lerr = s.KeyInsert(context.Background(), intent("blocker"))
	}()
	waitFor(t, s.batches, "the leading batch", func() bool { return s.batches.inFlight == 1 })
	var once sync.Once
	release = func() { once.Do(func() { _ = tx.Rollback(context.Background()) }) }
	t.Cleanup(func() { release(); <-done })
	return release, func() (bool, error) { <-done; return inserted, lerr }
}

// A batch whose statement fails as a whole (here one attempt's charge is
// refused by a trigger) is run again as single statements: the attempt at
// fault gets its own error, every other attempt its own success.
func TestBatchFailureFallsBackToSingles(t *testing.T) {
	t.Parallel()
	s := setupBatch(t)
	refusePoison(t, s)
	release, wait := holdInserts(t, s)

	keys := []string{"a", "b", "poison", "c", "d"}
	type out struct {
		inserted bool
		err      error
	}
	outs := make([]out, len(keys))
	var wg sync.WaitGroup
	for i, k := range keys {
		wg.Go(func() {
			_, outs[i].inserted, outs[i].err = s.KeyInsert(t.Context(), intent(k))
		})
	}
	waitFor(t, s.batches, "the attempts to queue", func() bool { return len(s.batches.queue) == len(keys) })
	release()
	wg.Wait()
	if ins, err := wait(); err != nil || !ins {
		t.Fatalf("the leading attempt: inserted=%v err=%v", ins, err)
	}
	if got := s.batches.failed.Load(); got != 1 {
		t.Fatalf("%d failed batches, want 1 (the five attempts went in one batch)", got)
	}
	for i, k := range keys {
		o := outs[i]
		if k == "poison" {
			if o.err == nil || !strings.Contains(o.err.Error(), "poisoned charge") {
				t.Fatalf("poison: err = %v, want its own trigger's error", o.err)
			}
			if _, err := s.KeyGet(t.Context(), "m1", k); chargeonce.ErrorCode(err) != chargeonce.ENOTFOUND {
				t.Fatalf("poison: KeyGet after the failed insert: %v, want ENOTFOUND", err)
			}
			continue
		}
		if o.err != nil || !o.inserted {
			t.Fatalf("%s: inserted=%v err=%v: an attempt saw another's failure", k, o.inserted, o.err)
		}
		if rec, err := s.KeyGet(t.Context(), "m1", k); err != nil || rec.Charge.ID != "ch_"+k {
			t.Fatalf("%s: KeyGet: %+v %v", k, rec.Charge, err)
		}
	}
}

// An attempt whose context ends while it waits in the queue leaves it and
// never runs: no record appears after its caller was told it failed.
func TestBatchQueuedAttemptCancelled(t *testing.T) {
	t.Parallel()
	s := setupBatch(t)
	release, wait := holdInserts(t, s)

	// A live attempt queues too, so that the two would share a batch.
	var (
		wg      sync.WaitGroup
		liveIns bool
		liveErr error
	)
	wg.Go(func() { _, liveIns, liveErr = s.KeyInsert(t.Context(), intent("live")) })
	waitFor(t, s.batches, "the live attempt to queue", func() bool { return len(s.batches.queue) == 1 })

	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	// Should the attempt wait out the batch instead of leaving, the held
	// batch goes on after a while and the checks below fail rather than
	// hang.
	safety := time.AfterFunc(5*time.Second, release)
	defer safety.Stop()
	_, _, err := s.KeyInsert(ctx, intent("gone"))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("KeyInsert with a context ending in the queue: %v, want its deadline", err)
	}
	s.batches.mu.Lock()
	queued := len(s.batches.queue)
	s.batches.mu.Unlock()
	if queued != 1 {
		t.Fatalf("%d attempts left in the queue, want 1 (the live one)", queued)
	}
	release()
	if _, err := wait(); err != nil {
		t.Fatalf("the leading attempt: %v", err)
	}
	wg.Wait()
	if !liveIns || liveErr != nil {
		t.Fatalf("the live attempt: inserted=%v err=%v", liveIns, liveErr)
	}
	if _, err := s.KeyGet(t.Context(), "m1", "gone"); chargeonce.ErrorCode(err) != chargeonce.ENOTFOUND {
		t.Fatalf("KeyGet of the cancelled attempt's key: %v, want ENOTFOUND", err)
	}
}

func insertOK(t *testing.T, s *Store, p chargeonce.KeyInsertParams) chargeonce.KeyRecord {
	t.Helper()
	rec, inserted, err := s.KeyInsert(t.Context(), p)
	if err != nil || !inserted {
		t.Fatalf("KeyInsert(%s): inserted=%v err=%v", p.Charge.IdempotencyKey, inserted, err)
	}
	return rec
}

// Completions queued behind a running one go together in one statement:
// each owner's compare-and-set succeeds, a stale token on a key of the same
// batch gets ESTALE (in a batch of its own: one key never appears twice in
// a batch), and the outbox trigger writes a notified record's answer.
func TestBatchCompletions(t *testing.T) {
	t.Parallel()
	s := setupBatch(t)
	recs := map[string]chargeonce.KeyInsertParams{}
	for _, k := range []string{"held", "a", "b", "c", "notified"} {
		p := intent(k)
		insertOK(t, s, p)
		recs[k] = p
	}
	if ok, err := s.KeyNotify(t.Context(), "m1", "notified"); err != nil || !ok {
		t.Fatalf("KeyNotify: %v %v", ok, err)
	}
	complete := func(k, token string) error {
		return s.KeyComplete(t.Context(), chargeonce.KeyCompleteParams{
			MerchantID: "m1", Key: k, Token: token, ChargeStatus: chargeonce.StatusCaptured,
			ResponseStatus: 201, ResponseBody: []byte(`{"key":"` + k + `"}`), TTL: time.Hour,
		})
	}
	// Hold the first completion on a row lock.
	tx, err := s.pool.Begin(t.Context())
	if err != nil {
		t.Fatalf("Begin: %v", err)
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // released below
	if _, err := tx.Exec(t.Context(), `SELECT FROM idempotency_keys WHERE key = 'held' FOR UPDATE`); err != nil {
		t.Fatalf("locking: %v", err)
	}
	var wg sync.WaitGroup
	var heldErr error
	wg.Go(func() { heldErr = complete("held", recs["held"].Token) })
	waitFor(t, s.batches, "the leading batch", func() bool { return s.batches.inFlight == 1 })

	type call struct{ key, token, want string }
	calls := []call{
		{"a", recs["a"].Token, ""}, {"b", recs["b"].Token, ""}, {"c", recs["c"].Token, ""},
		{"notified", recs["notified"].Token, ""}, {"a", "tok_stale", chargeonce.ESTALE},
	}
	errs := make([]error, len(calls))
	for i, c := range calls {
		wg.Go(func() { errs[i] = complete(c.key, c.token) })
	}
	waitFor(t, s.batches, "the completions to queue", func() bool { return len(s.batches.queue) == len(calls) })
	if err := tx.Rollback(t.Context()); err != nil {
		t.Fatalf("Rollback: %v", err)
	}
	wg.Wait()
	if heldErr != nil {
		t.Fatalf("the leading completion: %v", heldErr)
	}
	for i, c := range calls {
		if c.want == "" && errs[i] != nil {
			t.Fatalf("KeyComplete(%s) by its owner: %v", c.key, errs[i])
		}
		if c.want != "" && chargeonce.ErrorCode(errs[i]) != c.want {
			t.Fatalf("KeyComplete(%s) with %s: %v, want %s", c.key, c.token, errs[i], c.want)
		}
	}
	if got := s.batches.batched.Load(); got < 1 {
		t.Fatalf("%d completion batches, want at least 1", got)
	}
	for _, k := range []string{"a", "b", "c", "notified"} {
		rec, err := s.KeyGet(t.Context(), "m1", k)
		if err != nil || rec.State != chargeonce.KeyCompleted || rec.Charge.Status != chargeonce.StatusCaptured ||
			rec.Token != recs[k].Token || rec.ExpiresIn <= 0 {
			t.Fatalf("%s after its batch: %+v %v", k, rec, err)
		}
	}
	entries, err := s.OutboxClaim(t.Context(), time.Minute, 10)
	if err != nil || len(entries) != 1 || entries[0].Key != "notified" || string(entries[0].ResponseBody) != `{"key":"notified"}` {
		t.Fatalf("outbox after the batch: %+v %v, want the notified record's answer only", entries, err)
	}
	// Every settlement records its event, though m1 has no endpoint.
	var events int
	if err := s.pool.QueryRow(t.Context(), `SELECT count(DISTINCT charge_id) FROM webhook_events WHERE type = 'charge.captured' AND charge_id = ANY($1)`,
		[]string{"ch_held", "ch_a", "ch_b", "ch_c", "ch_notified"}).Scan(&events); err != nil || events != 5 {
		t.Fatalf("events after the batch: %d, %v; want one for each of the 5 settled charges", events, err)
	}
}

// A single statement run again after a failed batch may find the batch's
// own work committed (a connection lost on COMMIT): the record under the
// attempt's own token is its own insert, and its own completion.
func TestRetryFindsOwnWork(t *testing.T) {
	t.Parallel()
	s := setupBatch(t)
	p := intent("own")
	if _, ins, _, err := s.insertOne(t.Context(), p); err != nil || !ins {
		t.Fatalf("insertOne: %v %v", ins, err)
	}
	if rec, ins, _, err := s.insertOne(t.Context(), p); err != nil || !ins || rec.Token != p.Token {
		t.Fatalf("insertOne again with the same token: inserted=%v err=%v, want its own record", ins, err)
	}
	other := p
	other.Token, other.Charge.ID = "tok_other", "ch_other"
	if _, ins, _, err := s.insertOne(t.Context(), other); err != nil || ins {
		t.Fatalf("insertOne with another token: inserted=%v err=%v, want the existing record", ins, err)
	}
	cp := chargeonce.KeyCompleteParams{MerchantID: "m1", Key: "own", Token: p.Token, ChargeStatus: chargeonce.StatusCaptured,
		ResponseStatus: 201, ResponseBody: []byte("{}"), TTL: time.Hour}
	if err := s.completeOne(t.Context(), cp, false); err != nil {
		t.Fatalf("completeOne: %v", err)
	}
	if err := s.completeOne(t.Context(), cp, true); err != nil {
		t.Fatalf("completeOne again after a failed batch: %v, want its own completion found", err)
	}
	if err := s.completeOne(t.Context(), cp, false); chargeonce.ErrorCode(err) != chargeonce.ESTALE {
		t.Fatalf("completeOne again outside a retry: %v, want ESTALE", err)
	}
	cp.Token = "tok_other"
	if err := s.completeOne(t.Context(), cp, true); chargeonce.ErrorCode(err) != chargeonce.ESTALE {
		t.Fatalf("completeOne with another token after a failed batch: %v, want ESTALE", err)
	}
}

// Inserts and completions queued together go in one batch, one round trip
// and one transaction, each attempt with its own outcome: an insert of a
// key whose completion is in the same batch finds the record processing
// (as it would a moment before the completion), new keys are inserted,
// owners complete. When that transaction fails (here one new charge is
// refused by a trigger), every attempt in it, completions included, runs
// its own single statement: only the attempt at fault fails.
func TestBatchMixesInsertsAndCompletions(t *testing.T) {
	t.Parallel()
	for _, poisoned := range []bool{false, true} {
		t.Run(map[bool]string{false: "committed", true: "failed"}[poisoned], func(t *testing.T) {
			t.Parallel()
			s := setupBatch(t)
			refusePoison(t, s)
			owned := map[string]chargeonce.KeyRecord{"x": insertOK(t, s, intent("x")), "y": insertOK(t, s, intent("y"))}
			release, wait := holdInserts(t, s)

			newKeys := []string{"n1", "n2"}
			if poisoned {
				newKeys = append(newKeys, "poison")
			}
			var (
				wg        sync.WaitGroup
				mu        sync.Mutex
				completed = map[string]error{}
				inserted  = map[string]bool{}
				insErr    = map[string]error{}
				retryRec  chargeonce.KeyRecord
				retryIns  bool
				retryErr  error
			)
			for k, rec := range owned {
				wg.Go(func() {
					err := s.KeyComplete(t.Context(), chargeonce.KeyCompleteParams{
						MerchantID: "m1", Key: k, Token: rec.Token, ChargeStatus: chargeonce.StatusCaptured,
						ResponseStatus: 201, ResponseBody: []byte(`{"key":"` + k + `"}`), TTL: time.Hour,
					})
					mu.Lock()
					completed[k] = err
					mu.Unlock()
				})
			}
			for _, k := range newKeys {
				wg.Go(func() {
					_, ins, err := s.KeyInsert(t.Context(), intent(k))
					mu.Lock()
					inserted[k], insErr[k] = ins, err
					mu.Unlock()
				})
			}
			// A retry of x by another client, in the same batch as x's completion.
			wg.Go(func() {
				p := intent("x")
				p.Charge.ID = "ch_x_retry"
				retryRec, retryIns, retryErr = s.KeyInsert(t.Context(), p)
			})
			queued := len(owned) + len(newKeys) + 1
			waitFor(t, s.batches, "the attempts to queue", func() bool { return len(s.batches.queue) == queued })
			release()
			wg.Wait()
			if ins, err := wait(); err != nil || !ins {
				t.Fatalf("the leading attempt: inserted=%v err=%v", ins, err)
			}
			if got := s.batches.batched.Load(); got != 1 {
				t.Fatalf("%d batches, want 1: the inserts and completions went together", got)
			}
			wantFailed := map[bool]int64{false: 0, true: 1}[poisoned]
			if got := s.batches.failed.Load(); got != wantFailed {
				t.Fatalf("%d failed batches, want %d", got, wantFailed)
			}
			for k, err := range completed {
				if err != nil {
					t.Fatalf("KeyComplete(%s) by its owner: %v", k, err)
				}
				rec, err := s.KeyGet(t.Context(), "m1", k)
				if err != nil || rec.State != chargeonce.KeyCompleted || rec.Charge.Status != chargeonce.StatusCaptured {
					t.Fatalf("%s after its batch: %+v %v", k, rec, err)
				}
			}
			for _, k := range newKeys {
				if k == "poison" {
					if err := insErr[k]; err == nil || !strings.Contains(err.Error(), "poisoned charge") {
						t.Fatalf("poison: err = %v, want its own trigger's error", err)
					}
					continue
				}
				if insErr[k] != nil || !inserted[k] {
					t.Fatalf("%s: inserted=%v err=%v: an attempt saw another's outcome", k, inserted[k], insErr[k])
				}
			}
			if retryErr != nil || retryIns || retryRec.Token != owned["x"].Token || retryRec.Charge.ID != owned["x"].Charge.ID {
				t.Fatalf("the retry of x: inserted=%v err=%v record %+v, want x's own record", retryIns, retryErr, retryRec)
			}
			var charges int
			if err := s.pool.QueryRow(t.Context(), `SELECT count(*) FROM charges WHERE idempotency_key = 'x'`).Scan(&charges); err != nil || charges != 1 {
				t.Fatalf("charges for x: %d %v, want 1", charges, err)
			}
		})
	}
}

// A batch with one attempt per key inserts with keyInsertNewBatchSQL, which
// returns only what the database set; the record each attempt gets is the
// one stored, an attempt whose key was already taken reads and gets that
// record, never inserted, and one whose key had expired replaces it.
func TestBatchOfNewKeys(t *testing.T) {
	t.Parallel()
	s := setupBatch(t)
	taken := insertOK(t, s, intent("taken"))
	old := insertOK(t, s, intent("expired"))
	if err := s.KeyComplete(t.Context(), chargeonce.KeyCompleteParams{MerchantID: "m1", Key: "expired", Token: old.Token,
		ChargeStatus: chargeonce.StatusCaptured, ResponseStatus: 201, ResponseBody: []byte("{}"), TTL: time.Millisecond}); err != nil {
		t.Fatalf("KeyComplete: %v", err)
	}
	time.Sleep(10 * time.Millisecond) // past its expiry by the database's clock too
	release, wait := holdInserts(t, s)

	keys := []string{"n1", "n2", "n3", "taken", "expired"}
	type out struct {
		rec      chargeonce.KeyRecord
		inserted bool
		err      error
	}
	outs := make([]out, len(keys))
	var wg sync.WaitGroup
	for i, k := range keys {
		wg.Go(func() {
			p := intent(k)
			p.Lease = 90 * time.Second
			p.Charge.ID += "_batch" // charges outlive expired keys: ids never repeat
			p.Charge.Description = "desc " + k
			outs[i].rec, outs[i].inserted, outs[i].err = s.KeyInsert(t.Context(), p)
		})
	}
	waitFor(t, s.batches, "the attempts to queue", func() bool { return len(s.batches.queue) == len(keys) })
	release()
	wg.Wait()
	if _, err := wait(); err != nil {
		t.Fatalf("the leading attempt: %v", err)
	}
	if b, f := s.batches.batched.Load(), s.batches.failed.Load(); b != 1 || f != 0 {
		t.Fatalf("%d batches, %d failed; want 1 and 0", b, f)
	}
	for i, k := range keys {
		o := outs[i]
		if o.err != nil {
			t.Fatalf("%s: %v", k, o.err)
		}
		stored, err := s.KeyGet(t.Context(), "m1", k)
		if err != nil {
			t.Fatalf("KeyGet(%s): %v", k, err)
		}
		if k == "taken" {
			if o.inserted || o.rec.Token != taken.Token || o.rec.Charge.ID != taken.Charge.ID {
				t.Fatalf("taken: inserted=%v token %s charge %s, want the existing record's %s %s",
					o.inserted, o.rec.Token, o.rec.Charge.ID, taken.Token, taken.Charge.ID)
			}
			continue
		}
		if !o.inserted {
			t.Fatalf("%s: not inserted", k)
		}
		if k == "expired" && (o.rec.Token == old.Token || o.rec.Charge.ID == old.Charge.ID) {
			t.Fatalf("expired: got the expired record back, want a new one")
		}
		// The time left on the lease is measured when read: compare it
		// apart, and the rest exactly.
		if d := o.rec.LeaseRemaining - stored.LeaseRemaining; d < 0 || d > 5*time.Second || o.rec.LeaseRemaining > 90*time.Second {
			t.Fatalf("%s: lease remaining %v when inserted, %v when read", k, o.rec.LeaseRemaining, stored.LeaseRemaining)
		}
		got, want := o.rec, stored
		got.LeaseRemaining, want.LeaseRemaining = 0, 0
		got.Age, want.Age = 0, 0 // measured when read, like the lease
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%s: the batch returned\n%+v\nthe database holds\n%+v", k, got, want)
		}
	}
}

// TestBatchSameKeyTwice: two attempts at one key in one batch (the
// contended case) go through the batch statement that also reads the record
// that won, in one statement and without failing back to singles: one
// attempt inserts, the other gets the winner's record as the store holds it.
func TestBatchSameKeyTwice(t *testing.T) {
	t.Parallel()
	s := setupBatch(t)
	release, wait := holdInserts(t, s)
	keys := []string{"same", "same", "other"}
	type out struct {
		rec      chargeonce.KeyRecord
		inserted bool
		err      error
	}
	outs := make([]out, len(keys))
	var wg sync.WaitGroup
	for i, k := range keys {
		wg.Go(func() {
			p := intent(k)
			p.Charge.ID += fmt.Sprintf("_%d", i)
			outs[i].rec, outs[i].inserted, outs[i].err = s.KeyInsert(t.Context(), p)
		})
	}
	waitFor(t, s.batches, "the attempts to queue", func() bool { return len(s.batches.queue) == len(keys) })
	release()
	wg.Wait()
	if _, err := wait(); err != nil {
		t.Fatalf("the leading attempt: %v", err)
	}
	if b, f := s.batches.batched.Load(), s.batches.failed.Load(); b != 1 || f != 0 {
		t.Fatalf("%d batches, %d failed; want 1 and 0: the batch statement must run as written", b, f)
	}
	if outs[0].err != nil || outs[1].err != nil || outs[0].inserted == outs[1].inserted {
		t.Fatalf("two attempts at one key: %+v, %+v; want one inserted", outs[0], outs[1])
	}
	winner, loser := outs[0], outs[1]
	if loser.inserted {
		winner, loser = loser, winner
	}
	if loser.rec.Token != winner.rec.Token || loser.rec.Charge.ID != winner.rec.Charge.ID || !loser.rec.LeaseHeld {
		t.Fatalf("the second attempt got %+v, want the winner's record %+v", loser.rec, winner.rec)
	}
}
