package sqlite

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
)

// migrationFS holds the schema, one file per version, named
// NNNN_description.sql and applied in version order.
//
//go:embed migrations/*.sql
var migrationFS embed.FS

// migration is one embedded schema file.
type migration struct {
	version int
	name    string
	sql     string
}

// migrations returns the embedded migrations in version order.
func migrations() ([]migration, error) {
	names, err := fs.Glob(migrationFS, "migrations/*.sql")
	if err != nil {
		return nil, fmt.Errorf("listing migrations: %w", err)
	}
	ms := make([]migration, 0, len(names))
	seen := map[int]string{}
	for _, name := range names {
		base := path.Base(name)
		num, _, ok := strings.Cut(base, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v <= 0 {
			return nil, fmt.Errorf("migration %s: name must start with a positive version number and '_'", base)
		}
		if other, dup := seen[v]; dup {
			return nil, fmt.Errorf("migrations %s and %s share version %d", other, base, v)
		}
		seen[v] = base
		b, err := migrationFS.ReadFile(name)
		if err != nil {
			return nil, fmt.Errorf("reading migration %s: %w", base, err)
		}
		ms = append(ms, migration{version: v, name: strings.TrimSuffix(base, ".sql"), sql: string(b)})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].version < ms[j].version })
	return ms, nil
}

// Migrate applies the embedded migrations that schema_migrations does not
// list yet, all in one transaction.
//
// It is safe to run from several Store instances (or processes) on the same
// file at once: the transaction begins IMMEDIATE, so SQLite lets one of them
// in at a time (the others wait, up to the busy timeout), and the applied
// versions are read inside that transaction, after the lock is held; a
// latecomer finds the work done and commits nothing.
func (s *Store) Migrate(ctx context.Context) error {
	ms, err := migrations()
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
		if applied[m.version] {
			continue
		}
		if _, err := tx.ExecContext(ctx, m.sql); err != nil {
			return wrap(fmt.Sprintf("migrating: applying %s", m.name), err)
		}
		if _, err := tx.ExecContext(ctx,
			`INSERT INTO schema_migrations (version, name, applied_at) VALUES (?1, ?2, `+nowMicros+`)`,
			m.version, m.name,
		); err != nil {
			return wrap(fmt.Sprintf("migrating: recording %s", m.name), err)
		}
	}
	if err := tx.Commit(); err != nil {
		return wrap("migrating: committing", err)
	}
	return nil
}
