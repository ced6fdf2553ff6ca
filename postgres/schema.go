package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/chargeonce/chargeonce/internal/migrations"
)

// SchemaVersion is the version of the newest migration this build embeds:
// the schema Migrate brings a database to. `chargeonce version` prints it.
func SchemaVersion() (int, error) { return migrations.Latest(migrationFS, "migrations") }

// AppliedMigrations lists the versions schema_migrations records in the
// current schema, in order; none on a database never migrated.
func (s *Store) AppliedMigrations(ctx context.Context) ([]int, error) {
	var versions []int
	err := s.pool.QueryRow(ctx, `SELECT coalesce(array_agg(version ORDER BY version), '{}')
		FROM schema_migrations`).Scan(&versions)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" { // undefined_table: never migrated
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading schema_migrations: %w", translate(err))
	}
	return versions, nil
}
