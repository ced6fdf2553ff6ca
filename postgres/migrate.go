package postgres

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/chargeonce/chargeonce/internal/migrations"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// migrateLockKey is the advisory lock key that serializes Migrate across
// instances ("chargonc" in ASCII). It is one constant for the whole
// database, so migrations of different schemas (tests give each store its
// own) also take turns, and a constant cannot disagree between two
// instances, or two releases, about which schema they are in: releases
// before the online runner took it with pg_advisory_xact_lock, this one
// with pg_advisory_lock, and the two exclude each other.
const migrateLockKey int64 = 0x63686172676f6e63

// Online migrations: every step waits at most migrateLockTimeout for a lock
// (an ALTER TABLE queued behind a long transaction would otherwise block
// every reader queued behind it), and is retried after a backoff that
// doubles from migrateRetryFirst up to migrateRetryCap, migrateRetries times.
const (
	migrateLockTimeout = "50ms"
	migrateRetryFirst  = 10 * time.Millisecond
	migrateRetryCap    = time.Second
	migrateRetries     = 100
)

// backfillBlocks is how many of a table's pages one batch of a backfill
// covers: about 5,000 records of idempotency_keys, a transaction of a few
// tens of milliseconds.
const backfillBlocks = 100

// Migrate applies the embedded migrations that the current schema (the
// first of the connection's search_path) has not seen yet, recording each in
// schema_migrations, while traffic flows.
//
// Several instances may start, and migrate, at the same moment: Migrate
// holds a session advisory lock on one connection for its whole run, so they
// take turns; the first applies the migrations, the others find them
// recorded. The lock needs a session, so Migrate needs a direct connection
// (not one through a pooler in transaction mode).
//
// Each migration is a list of steps (see migrations.Step), each run and
// recorded in schema_migration_steps in a transaction of its own: DDL with
// a lock timeout and retries, so that no step holds ACCESS EXCLUSIVE while
// it waits or scans; backfills in batches of pages, each committed with its
// progress, after the DDL has committed. A migration is recorded in
// schema_migrations when its last step is done; one that was interrupted
// (a crash, a deploy) resumes at the step, and the batch, where it stopped.
func (s *Store) Migrate(ctx context.Context) error {
	ms, err := migrations.Load(migrationFS, "migrations")
	if err != nil {
		return fmt.Errorf("reading migrations: %w", err)
	}
	versions := make([]int, len(ms))
	for i, m := range ms {
		versions[i] = m.Version
	}
	if err := s.checkDirect(ctx, versions); err != nil {
		return fmt.Errorf("migrating: %w", err)
	}
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("migrating: %w", err)
	}
	// The URL's lock_timeout and statement_timeout bound the service's
	// statements, not the wait for another instance's migrations nor a
	// backfill batch or an index build: the migration session runs without
	// them (each step sets its own lock timeout), and release restores them.
	for _, set := range []string{"SET lock_timeout = 0", "SET statement_timeout = 0", "SELECT pg_advisory_lock($1)"} {
		var args []any
		if strings.HasPrefix(set, "SELECT") {
			args = []any{migrateLockKey}
		}
		if _, err := conn.Exec(ctx, set, args...); err != nil {
			// The lock may have been granted as ctx ended: drop the session.
			_ = conn.Hijack().Close(context.WithoutCancel(ctx))
			return fmt.Errorf("migrating: taking the migration lock: %w", err)
		}
	}
	defer release(ctx, conn)
	m := migrator{conn: conn.Conn()}
	if err := m.run(ctx, ms); err != nil {
		return fmt.Errorf("migrating: %w", err)
	}
	return nil
}

// release gives up the migration lock, restores the URL's timeouts and
// gives back the connection. When either cannot run (ctx ended, connection broken), the connection is closed, which
// releases the lock with the session.
func release(ctx context.Context, conn *pgxpool.Conn) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_unlock($1)", migrateLockKey); err != nil {
		_ = conn.Hijack().Close(ctx)
		return
	}
	for _, reset := range []string{"RESET lock_timeout", "RESET statement_timeout"} {
		if _, err := conn.Exec(ctx, reset); err != nil {
			_ = conn.Hijack().Close(ctx)
			return
		}
	}
	conn.Release()
}

// migrator applies migrations on the one connection that holds the lock.
type migrator struct {
	conn *pgx.Conn
}

func (m migrator) run(ctx context.Context, ms []migrations.Migration) error {
	if _, err := m.conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
			version    integer     PRIMARY KEY,
			name       text        NOT NULL,
			applied_at timestamptz NOT NULL DEFAULT now()
		)`); err != nil {
		return fmt.Errorf("creating schema_migrations: %w", err)
	}
	// One row per step done (or backfill under way) of a migration not yet
	// in schema_migrations; next_block is where a backfill resumes.
	if _, err := m.conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migration_steps (
			version    integer NOT NULL,
			step       integer NOT NULL,
			next_block bigint  NOT NULL DEFAULT 0,
			since_xid  bigint,
			done       boolean NOT NULL DEFAULT false,
			PRIMARY KEY (version, step)
		)`); err != nil {
		return fmt.Errorf("creating schema_migration_steps: %w", err)
	}
	rows, err := m.conn.Query(ctx, "SELECT version FROM schema_migrations")
	if err != nil {
		return fmt.Errorf("reading schema_migrations: %w", err)
	}
	applied, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return fmt.Errorf("reading schema_migrations: %w", err)
	}
	done := make(map[int]bool, len(applied))
	for _, v := range applied {
		done[int(v)] = true
	}
	for _, mig := range ms {
		if done[mig.Version] {
			continue
		}
		if err := m.apply(ctx, mig); err != nil {
			return fmt.Errorf("applying migration %s: %w", mig.Name, err)
		}
	}
	return nil
}

// apply runs the steps of mig that are not done yet, then records mig.
func (m migrator) apply(ctx context.Context, mig migrations.Migration) error {
	steps, err := mig.Steps()
	if err != nil {
		return err
	}
	type progress struct {
		next  int64
		since *int64
		done  bool
	}
	prog := map[int]progress{}
	rows, err := m.conn.Query(ctx, "SELECT step, next_block, since_xid, done FROM schema_migration_steps WHERE version = $1", mig.Version)
	if err != nil {
		return fmt.Errorf("reading its progress: %w", err)
	}
	var (
		step int32
		p    progress
	)
	if _, err := pgx.ForEachRow(rows, []any{&step, &p.next, &p.since, &p.done}, func() error {
		prog[int(step)] = p
		return nil
	}); err != nil {
		return fmt.Errorf("reading its progress: %w", err)
	}
	for i, st := range steps {
		if prog[i].done {
			continue
		}
		switch st.Kind {
		case migrations.StepTx:
			err = m.inTx(ctx, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, st.SQL); err != nil {
					return err
				}
				return markDone(ctx, tx, mig.Version, i)
			})
		case migrations.StepNoTx:
			err = m.noTx(ctx, st.SQL)
			if err == nil {
				err = m.inTx(ctx, func(tx pgx.Tx) error { return markDone(ctx, tx, mig.Version, i) })
			}
		case migrations.StepBackfill:
			err = m.backfill(ctx, mig.Version, i, st, prog[i].next, prog[i].since)
		}
		if err != nil {
			return fmt.Errorf("step %d: %w", i, err)
		}
	}
	return m.inTx(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)", mig.Version, mig.Name); err != nil {
			return fmt.Errorf("recording it: %w", err)
		}
		if _, err := tx.Exec(ctx, "DELETE FROM schema_migration_steps WHERE version = $1", mig.Version); err != nil {
			return fmt.Errorf("recording it: %w", err)
		}
		return nil
	})
}

func markDone(ctx context.Context, tx pgx.Tx, version, step int) error {
	if _, err := tx.Exec(ctx, `INSERT INTO schema_migration_steps (version, step, done) VALUES ($1, $2, true)
		ON CONFLICT (version, step) DO UPDATE SET done = true`, version, step); err != nil {
		return fmt.Errorf("recording the step: %w", err)
	}
	return nil
}

// backfill runs st over the pages of its table from page next on, in
// batches of backfillBlocks pages, each batch committed with the page where
// the next one starts. Rows written past the end while it runs are covered
// too: the end is read again when reached.
//
// A row the backfill updated may move to a page it has yet to walk. A
// statement whose WHERE cannot tell a row it has done from one to do takes
// $3: the transaction id before the backfill began (kept across a resume),
// so that `AND age(xmin) > age($3::text::xid)` skips every row written since,
// by the backfill or by traffic.
func (m migrator) backfill(ctx context.Context, version, step int, st migrations.Step, next int64, since *int64) error {
	if since == nil {
		var xid int64
		if err := m.conn.QueryRow(ctx, `SELECT txid_current() % 4294967296`).Scan(&xid); err != nil {
			return fmt.Errorf("reading the transaction id: %w", err)
		}
		if _, err := m.conn.Exec(ctx, `INSERT INTO schema_migration_steps (version, step, since_xid) VALUES ($1, $2, $3)
			ON CONFLICT (version, step) DO UPDATE SET since_xid = $3`, version, step, xid); err != nil {
			return fmt.Errorf("recording the step: %w", err)
		}
		since = &xid
	}
	args := func(from, to int64) []any {
		if strings.Contains(st.SQL, "$3") {
			return []any{tid(from), tid(to), strconv.FormatInt(*since, 10)}
		}
		return []any{tid(from), tid(to)}
	}
	size := func() (int64, error) {
		var n int64
		err := m.conn.QueryRow(ctx, `SELECT pg_relation_size($1::regclass) / current_setting('block_size')::bigint`, st.Table).Scan(&n)
		if err != nil {
			return 0, fmt.Errorf("sizing %s: %w", st.Table, err)
		}
		return n, nil
	}
	end, err := size()
	if err != nil {
		return err
	}
	for {
		if next >= end {
			if end, err = size(); err != nil {
				return err
			}
			if next >= end {
				break
			}
		}
		to := next + backfillBlocks
		err := m.inTx(ctx, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, st.SQL, args(next, to)...); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO schema_migration_steps (version, step, next_block) VALUES ($1, $2, $3)
				ON CONFLICT (version, step) DO UPDATE SET next_block = $3`, version, step, to)
			return err
		})
		if err != nil {
			return fmt.Errorf("backfilling %s from page %d: %w", st.Table, next, err)
		}
		next = to
	}
	return m.inTx(ctx, func(tx pgx.Tx) error { return markDone(ctx, tx, version, step) })
}

// tid is the first tuple id of page block.
func tid(block int64) pgtype.TID {
	return pgtype.TID{BlockNumber: uint32(min(max(block, 0), math.MaxUint32)), OffsetNumber: 0, Valid: true} //nolint:gosec // clamped to uint32's range
}

// inTx runs fn in a transaction whose locks wait at most migrateLockTimeout,
// again after a backoff while it fails for want of a lock.
func (m migrator) inTx(ctx context.Context, fn func(pgx.Tx) error) error {
	return retryLocks(ctx, func() error {
		return pgx.BeginFunc(ctx, m.conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '"+migrateLockTimeout+"'"); err != nil {
				return err
			}
			return fn(tx)
		})
	})
}

// noTx runs sql outside a transaction with the same lock timeout.
func (m migrator) noTx(ctx context.Context, sql string) error {
	if _, err := m.conn.Exec(ctx, "SET lock_timeout = '"+migrateLockTimeout+"'"); err != nil {
		return err
	}
	err := retryLocks(ctx, func() error {
		_, err := m.conn.Exec(ctx, sql)
		return err
	})
	if _, rerr := m.conn.Exec(ctx, "RESET lock_timeout"); rerr != nil && err == nil {
		err = rerr
	}
	return err
}

// retryLocks runs fn until it succeeds, fails for another reason than a lock
// timeout (SQLSTATE 55P03) or a deadlock it lost (40P01: traffic that read
// and then wrote a table the step locks), or has failed migrateRetries
// times. Either way the step's transaction was rolled back whole, so running
// it again is safe.
func retryLocks(ctx context.Context, fn func() error) error {
	wait := migrateRetryFirst
	for attempt := 1; ; attempt++ {
		err := fn()
		var pgErr *pgconn.PgError
		if err == nil || !errors.As(err, &pgErr) || (pgErr.Code != "55P03" && pgErr.Code != "40P01") {
			return err
		}
		if attempt == migrateRetries {
			return fmt.Errorf("no lock within %s in %d attempts (a long transaction holds the table?): %w", migrateLockTimeout, attempt, err)
		}
		// Jitter keeps two waiters from retrying in step.
		t := time.NewTimer(wait/2 + rand.N(wait/2+1)) //nolint:gosec // jitter, not a secret
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		wait = min(2*wait, migrateRetryCap)
	}
}
