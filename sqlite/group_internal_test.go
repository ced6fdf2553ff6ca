package sqlite

import (
	"context"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
)

// migrated opens a migrated store in a file of its own, closed when the
// test ends.
func migrated(t *testing.T) *Store {
	t.Helper()
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(t.TempDir(), "store.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return s
}

func groupIntent(key string) chargeonce.KeyInsertParams {
	return chargeonce.KeyInsertParams{
		Fingerprint: "fp_" + key, Token: "tok_" + key, Lease: time.Hour,
		Charge: chargeonce.Charge{ID: "ch_" + key, MerchantID: "m1", IdempotencyKey: key, OrderID: 1,
			AmountCents: 100, Currency: "BRL", PaymentToken: "tok_ok"},
	}
}

// Writes that wait for the writer share one transaction, each in a
// savepoint of its own: one that fails (here an insert whose charge id is
// taken, after its record was written) leaves nothing behind, and the
// others, inserts and completions alike, commit with their own outcomes.
func TestGroupCommitKeepsEachWritesOutcome(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := migrated(t)
	owned := map[string]chargeonce.KeyRecord{}
	for _, k := range []string{"c", "c2"} {
		rec, ins, err := s.KeyInsert(ctx, groupIntent(k))
		if err != nil || !ins {
			t.Fatalf("KeyInsert(%s): %v %v", k, ins, err)
		}
		owned[k] = rec
	}
	// Hold the writer connection, so that a leading write waits for it and
	// the writes after it queue.
	hold, err := s.wdb.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var (
		wg      sync.WaitGroup
		leadErr error
	)
	wg.Go(func() { _, _, leadErr = s.KeyInsert(ctx, groupIntent("lead")) })
	waitRunning := time.Now().Add(5 * time.Second)
	for {
		s.group.mu.Lock()
		running := s.group.running
		s.group.mu.Unlock()
		if running {
			break
		}
		if time.Now().After(waitRunning) {
			t.Fatal("the leading write never started")
		}
		time.Sleep(time.Millisecond)
	}

	type out struct {
		inserted bool
		err      error
	}
	var mu sync.Mutex
	outs := map[string]out{}
	for _, k := range []string{"a", "b", "dupid"} {
		wg.Go(func() {
			p := groupIntent(k)
			if k == "dupid" {
				p.Charge.ID = owned["c"].Charge.ID // taken: the charge insert fails after the record's
			}
			_, ins, err := s.KeyInsert(ctx, p)
			mu.Lock()
			outs[k] = out{ins, err}
			mu.Unlock()
		})
	}
	complete := func(k, token string) error {
		return s.KeyComplete(ctx, chargeonce.KeyCompleteParams{MerchantID: "m1", Key: k, Token: token,
			ChargeStatus: chargeonce.StatusCaptured, ResponseStatus: 201, ResponseBody: []byte(`{}`), TTL: time.Hour})
	}
	for name, c := range map[string]struct{ key, token string }{
		"complete c":  {"c", owned["c"].Token},
		"complete c2": {"c2", "tok_stale"},
	} {
		wg.Go(func() {
			err := complete(c.key, c.token)
			mu.Lock()
			outs[name] = out{err: err}
			mu.Unlock()
		})
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		s.group.mu.Lock()
		n := len(s.group.queue)
		s.group.mu.Unlock()
		if n == 5 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d writes queued, want 5", n)
		}
		time.Sleep(time.Millisecond)
	}
	if err := hold.Rollback(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if leadErr != nil {
		t.Fatalf("the leading write: %v", leadErr)
	}
	if got := s.group.shared.Load(); got != 1 {
		t.Fatalf("%d shared transactions, want 1", got)
	}
	for _, k := range []string{"a", "b"} {
		if o := outs[k]; o.err != nil || !o.inserted {
			t.Fatalf("%s: inserted=%v err=%v: a write saw another's failure", k, o.inserted, o.err)
		}
		if _, err := s.KeyGet(ctx, "m1", k); err != nil {
			t.Fatalf("KeyGet(%s): %v", k, err)
		}
	}
	if o := outs["dupid"]; o.err == nil || !strings.Contains(o.err.Error(), "inserting charge") {
		t.Fatalf("dupid: err = %v, want its own charge insert's failure", o.err)
	}
	if _, err := s.KeyGet(ctx, "m1", "dupid"); chargeonce.ErrorCode(err) != chargeonce.ENOTFOUND {
		t.Fatalf("KeyGet(dupid) after its failed write: %v, want ENOTFOUND (its record rolled back)", err)
	}
	if err := outs["complete c"].err; err != nil {
		t.Fatalf("the owner's KeyComplete: %v", err)
	}
	if rec, err := s.KeyGet(ctx, "m1", "c"); err != nil || rec.State != chargeonce.KeyCompleted || rec.Charge.Status != chargeonce.StatusCaptured {
		t.Fatalf("c after its completion: %+v %v", rec, err)
	}
	if err := outs["complete c2"].err; chargeonce.ErrorCode(err) != chargeonce.ESTALE {
		t.Fatalf("a stale KeyComplete: %v, want ESTALE", err)
	}
	if rec, err := s.KeyGet(ctx, "m1", "c2"); err != nil || rec.State != chargeonce.KeyProcessing {
		t.Fatalf("c2 after a stale completion: %+v %v", rec, err)
	}
}
