package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// errNeedsDirect is why Migrate refuses a pooled URL.
var errNeedsDirect = errors.New("the database URL goes through a connection pooler (PgBouncer?), and migrations need a direct connection to PostgreSQL: run `chargeonce migrate --db <direct URL>` first (docs/pooler.md)")

// checkDirect fails when migrations are pending and the store's
// connections reach PostgreSQL through a pooler. A schema that is up to
// date is fine either way: every instance runs Migrate at start, and behind
// a pooler it then has nothing to do.
//
// Migrations run DDL and backfills that take locks, set lock_timeout and
// may span several transactions on one session; a pooler in transaction
// mode hands each transaction to any server connection. A direct
// connection is recognised by its backend: the process id PostgreSQL sent
// when the connection started is the one that answers pg_backend_pid(); a
// pooler sends a key of its own.
func (s *Store) checkDirect(ctx context.Context, versions []int) error {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("checking for a pooler: %w", translate(err))
	}
	defer conn.Release()
	var backend uint32
	if err := conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&backend); err != nil {
		return fmt.Errorf("checking for a pooler: %w", translate(err))
	}
	if backend == conn.Conn().PgConn().PID() {
		return nil
	}
	rows, err := conn.Query(ctx, "SELECT version FROM schema_migrations")
	var applied []int32
	if err == nil {
		applied, err = pgx.CollectRows(rows, pgx.RowTo[int32])
	}
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == "42P01": // undefined_table: a new database
		return errNeedsDirect
	case err != nil:
		return fmt.Errorf("reading schema_migrations: %w", translate(err))
	}
	done := make(map[int]bool, len(applied))
	for _, v := range applied {
		done[int(v)] = true
	}
	for _, v := range versions {
		if !done[v] {
			return errNeedsDirect
		}
	}
	return nil
}

// behindPooler reports whether connections made with cfg reach PostgreSQL
// through a pooler, by the test checkDirect uses: a direct connection's
// backend answers pg_backend_pid() with the process id it sent at start.
func behindPooler(ctx context.Context, cfg *pgx.ConnConfig) (bool, error) {
	conn, err := pgx.ConnectConfig(ctx, cfg.Copy())
	if err != nil {
		return false, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var backend uint32
	if err := conn.QueryRow(ctx, "SELECT pg_backend_pid()", pgx.QueryExecModeSimpleProtocol).Scan(&backend); err != nil {
		return false, err
	}
	return backend != conn.PgConn().PID(), nil
}
