package sqlite

import (
	"context"
	"embed"
	"fmt"
	"strings"

	"github.com/chargeonce/chargeonce/internal/migrations"
)

// migrationFS holds the schema, one file per version, named
// NNNN_description.sql and applied in version order.
//
//go:embed migrations/*.sql
var migrationFS embed.FS

// Migrate applies the embedded migrations that schema_migrations does not
// list yet, all in one transaction.
//
// It is safe to run from several Store instances (or processes) on the same
// file at once: the transaction begins IMMEDIATE, so SQLite lets one of them
// in at a time (the others wait, up to the busy timeout), and the applied
// versions are read inside that transaction, after the lock is held; a
// latecomer finds the work done and commits nothing.
func (s *Store) Migrate(ctx context.Context) error {
	ms, err := migrations.Load(migrationFS, "migrations")
	if err != nil {
		return err
	}
	tx, err := s.wdb.BeginTx(ctx, nil)
	if err != nil {
		return wrap("migrating: beginning transaction", err)
	}
	defer rollback(tx)

	if _, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
	version    INTEGER NOT NULL PRIMARY KEY,
	name       TEXT    NOT NULL,
	applied_at INTEGER NOT NULL
) STRICT`); err != nil {
		return wrap("migrating: creating schema_migrations", err)
	}
	applied := map[int]bool{}
	rows, err := tx.QueryContext(ctx, `SELECT version FROM schema_migrations`)
	if err != nil {
		return wrap("migrating: reading applied versions", err)
	}
	for rows.Next() {
		var v int
		if err := rows.Scan(&v); err != nil {
			rows.Close()
			return wrap("migrating: reading applied versions", err)
		}
		applied[v] = true
	}
	if err := rows.Err(); err != nil {
		rows.Close()
		return wrap("migrating: reading applied versions", err)
	}
	if err := rows.Close(); err != nil {
		return wrap("migrating: reading applied versions", err)
	}

	for _, m := range ms {
		if applied[m.Version] {
			continue
		}
		if _, err := tx.ExecContext(ctx, m.SQL); err != nil {
			return wrap(fmt.Sprintf("migrating: applying %s", m.Name), err)
		}
		if _, err := tx.ExecContext(ctx,
			`INSERT INTO schema_migrations (version, name, applied_at) VALUES (?1, ?2, `+nowMicros+`)`,
			m.Version, strings.TrimSuffix(m.Name, ".sql"),
		); err != nil {
			return wrap(fmt.Sprintf("migrating: recording %s", m.Name), err)
		}
	}
	if err := tx.Commit(); err != nil {
		return wrap("migrating: committing", err)
	}
	return nil
}
