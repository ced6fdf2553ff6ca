package sqlite

import (
	"context"
	"database/sql"
	"sync"
	"sync/atomic"
	"time"
)

// Group commit.
//
// SQLite has one writer, and at synchronous=FULL every commit waits for an
// fsync, so the writes of concurrent attempts (KeyInsert and KeyComplete)
// share transactions: while one transaction is running, the writes that
// arrive queue up, and when it ends they all run in the next one, each
// inside a SAVEPOINT of its own, and commit together, with one fsync. A
// lone write runs alone, as it did before; transactions only grow when
// writes already wait for the writer.
//
// Each write keeps its own outcome: one that fails is rolled back to its
// savepoint and the others go on. A write learns its outcome only once its
// transaction has committed; when the commit (or the transaction itself)
// fails, every write in it gets that error, and none of them took effect.

// groupTimeout bounds a shared transaction: its writes run under the
// group's context, not their own (see write), so this is what ends a hung
// one.
const groupTimeout = 30 * time.Second

// write is one attempt's write transaction.
type write struct {
	ctx  context.Context
	what string // what the write does, for the transaction's errors
	fn   func(ctx context.Context, tx *sql.Tx) error
	err  error
	done chan struct{}
}

// group queues writes for the writer connection.
type group struct {
	mu      sync.Mutex
	queue   []*write
	running bool

	// shared counts the transactions that held two writes or more.
	shared atomic.Int64
}

// write runs fn in a transaction on the writer connection, shared with the
// writes that wait alongside it, and returns fn's error or the
// transaction's (prefixed with what). fn must use tx only, with the context
// it is given, and must leave no effect other than through it. A write whose
// context has ended before its turn does not run.
//
// fn gets ctx when it runs alone, and the shared transaction's context when
// it shares one: SQLite rolls back the whole transaction when a statement
// is interrupted, so one write's deadline ending mid-statement would fail
// every write beside it ("no such savepoint"). A member's deadline decides
// only whether it joins.
func (s *Store) write(ctx context.Context, what string, fn func(ctx context.Context, tx *sql.Tx) error) error {
	w := &write{ctx: ctx, what: what, fn: fn, done: make(chan struct{})}
	g := &s.group
	g.mu.Lock()
	g.queue = append(g.queue, w)
	var batch []*write
	if !g.running {
		g.running = true
		batch, g.queue = g.queue, nil
	}
	g.mu.Unlock()
	if batch != nil {
		s.commitGroup(batch) // this write leads: no hand-off to another goroutine
	}
	<-w.done
	return w.err
}

// commitGroup runs batch, tells its writes their outcomes, and starts the
// writes queued meanwhile on a goroutine of its own.
func (s *Store) commitGroup(batch []*write) {
	if len(batch) == 1 {
		s.runAlone(batch[0])
	} else {
		s.group.shared.Add(1)
		s.runShared(batch)
	}
	for _, w := range batch {
		close(w.done)
	}
	g := &s.group
	g.mu.Lock()
	next := g.queue
	g.queue = nil
	g.running = len(next) > 0
	g.mu.Unlock()
	if len(next) > 0 {
		go s.commitGroup(next)
	}
}

// runAlone runs one write in a transaction of its own, with its context.
func (s *Store) runAlone(w *write) {
	tx, err := s.wdb.BeginTx(w.ctx, nil)
	if err != nil {
		w.err = wrap(w.what+": beginning transaction", err)
		return
	}
	defer rollback(tx)
	if w.err = w.fn(w.ctx, tx); w.err != nil {
		return
	}
	if err := tx.Commit(); err != nil {
		w.err = wrap(w.what+": committing", err)
	}
}

// runShared runs batch's writes in one transaction, each in a savepoint.
func (s *Store) runShared(batch []*write) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(batch[0].ctx), groupTimeout)
	defer cancel()
	fail := func(step string, err error) {
		for _, w := range batch {
			w.err = wrap(w.what+": "+step, err)
		}
	}
	tx, err := s.wdb.BeginTx(ctx, nil)
	if err != nil {
		fail("beginning transaction", err)
		return
	}
	defer rollback(tx)
	for _, w := range batch {
		if err := w.ctx.Err(); err != nil {
			w.err = err
			continue
		}
		// One savepoint at a time, released before the next write: one
		// name serves them all.
		if _, err := tx.ExecContext(ctx, "SAVEPOINT w"); err != nil {
			fail("starting a savepoint", err)
			return
		}
		end := []string{"RELEASE w"}
		if w.err = w.fn(ctx, tx); w.err != nil {
			end = []string{"ROLLBACK TO w", "RELEASE w"}
		}
		for _, stmt := range end {
			if _, err := tx.ExecContext(ctx, stmt); err != nil {
				// The failed write took the transaction with it (SQLite
				// rolls back on some errors, I/O and a full disk among them).
				fail("ending a savepoint", err)
				return
			}
		}
	}
	if err := tx.Commit(); err != nil {
		fail("committing", err)
	}
}
