package postgres

import (
	"context"
	"embed"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/chargeonce/chargeonce/internal/migrations"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// migrateLockKey is the pg_advisory_xact_lock key that serializes Migrate
// across instances ("chargonc" in ASCII). It is one constant for the whole
// database, so migrations of different schemas (tests give each store its
// own) also take turns; they are short, and a constant cannot disagree
// between two instances about which schema they are in.
const migrateLockKey int64 = 0x63686172676f6e63

// Migrate applies the embedded migrations that the current schema (the
// first of the connection's search_path) has not seen yet, recording each in
// schema_migrations.
//
// Several instances may start, and migrate, at the same moment. Migrate runs
// in one transaction that first takes pg_advisory_xact_lock, so they take
// turns: the first applies the migrations, the others wait, then find them
// recorded and apply nothing. A transaction-scoped lock is released by COMMIT
// or ROLLBACK (or a dropped connection), so no error path can leave it held
// on a pooled connection. Migrate needs a direct connection, not one through
// a pooler, unless there is nothing to apply (checkDirect). PostgreSQL's DDL is transactional: a failed
// migration leaves the schema as it was.
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
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", migrateLockKey); err != nil {
			return fmt.Errorf("taking the migration lock: %w", err)
		}
		if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
			version    integer     PRIMARY KEY,
			name       text        NOT NULL,
			applied_at timestamptz NOT NULL DEFAULT now()
		)`); err != nil {
			return fmt.Errorf("creating schema_migrations: %w", err)
		}
		rows, err := tx.Query(ctx, "SELECT version FROM schema_migrations")
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
		for _, m := range ms {
			if done[m.Version] {
				continue
			}
			if _, err := tx.Exec(ctx, m.SQL); err != nil {
				return fmt.Errorf("applying migration %s: %w", m.Name, err)
			}
			if _, err := tx.Exec(ctx, "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)", m.Version, m.Name); err != nil {
				return fmt.Errorf("recording migration %s: %w", m.Name, err)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("migrating: %w", err)
	}
	return nil
}
