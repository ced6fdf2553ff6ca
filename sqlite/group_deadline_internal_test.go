package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"testing"
	"time"
)

// slowWriteSQL writes enough rows to take longer than slowWriteDeadline.
const slowWriteSQL = `INSERT INTO slow
	WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 20000) SELECT x FROM c`

const slowWriteDeadline = 2 * time.Millisecond

// A write whose own deadline passes while its statement runs in a shared
// transaction must not take the transaction down: SQLite rolls back the
// whole transaction when a write is interrupted, and the other writes then
// failed with "no such savepoint". Writes in a shared transaction run
// under the group's context; a member's deadline decides only whether it
// joins.
func TestGroupCommitOneDeadlineDoesNotFailTheGroup(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := migrated(t)
	if _, err := s.wdb.ExecContext(ctx, "CREATE TABLE slow (x INTEGER)"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.KeyInsert(ctx, groupIntent("warm")); err != nil { // prepares the statements
		t.Fatal(err)
	}
	// Hold the writer connection, so that a leading write waits for it and
	// the writes after it queue into one shared transaction.
	hold, err := s.wdb.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var leadErr error
	wg.Go(func() { _, _, leadErr = s.KeyInsert(ctx, groupIntent("lead")) })
	waitQueued(t, s, 0)

	// The slow write is first in the shared transaction; its deadline
	// passes while its statement runs.
	var slowErr error
	var slowTook time.Duration
	wg.Go(func() {
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		slowErr = s.write(wctx, "slow write", func(ctx context.Context, tx *sql.Tx) error {
			time.AfterFunc(slowWriteDeadline, cancel)
			start := time.Now()
			_, err := tx.ExecContext(ctx, slowWriteSQL)
			slowTook = time.Since(start)
			return err
		})
	})
	waitQueued(t, s, 1)
	const others = 20
	errs := make([]error, others)
	for i := range others {
		wg.Go(func() { _, _, errs[i] = s.KeyInsert(ctx, groupIntent(fmt.Sprintf("k%d", i))) })
	}
	waitQueued(t, s, 1+others)
	if err := hold.Rollback(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	t.Logf("the slow write took %v (its deadline: %v), ended with %v", slowTook, slowWriteDeadline, slowErr)
	if leadErr != nil {
		t.Fatalf("the leading write: %v", leadErr)
	}
	if got := s.group.shared.Load(); got != 1 {
		t.Fatalf("%d shared transactions, want 1", got)
	}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("write k%d shared a transaction with one whose deadline passed: %v", i, err)
		}
		if _, err := s.KeyGet(ctx, "m1", fmt.Sprintf("k%d", i)); err != nil {
			t.Fatalf("KeyGet(k%d): %v", i, err)
		}
	}
}

// waitQueued waits until n writes wait behind the running one.
func waitQueued(t *testing.T, s *Store, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		s.group.mu.Lock()
		running, queued := s.group.running, len(s.group.queue)
		s.group.mu.Unlock()
		if running && queued == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("running=%v, %d writes queued, want %d", running, queued, n)
		}
		time.Sleep(time.Millisecond)
	}
}
