package sqlite

import (
	"context"
	"fmt"

	"github.com/chargeonce/chargeonce/internal/migrations"
)

// SchemaVersion is the version of the newest migration this build embeds:
// the schema Migrate brings a database to. `chargeonce version` prints it.
func SchemaVersion() (int, error) { return migrations.Latest(migrationFS, "migrations") }

// AppliedMigrations lists the versions schema_migrations records, in
// order; none on a database never migrated.
func (s *Store) AppliedMigrations(ctx context.Context) ([]int, error) {
	var exists int
	if err := s.rdb.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'schema_migrations'`).Scan(&exists); err != nil {
		return nil, fmt.Errorf("reading schema_migrations: %w", translate(err))
	}
	if exists == 0 {
		return nil, nil
	}
	rows, err := s.rdb.QueryContext(ctx, `SELECT version FROM schema_migrations ORDER BY version`)
	if err != nil {
		return nil, fmt.Errorf("reading schema_migrations: %w", translate(err))
	}
	defer rows.Close()
	var versions []int
	for rows.Next() {
		var v int
		if err := rows.Scan(&v); err != nil {
			return nil, fmt.Errorf("reading schema_migrations: %w", translate(err))
		}
		versions = append(versions, v)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading schema_migrations: %w", translate(err))
	}
	return versions, nil
}
