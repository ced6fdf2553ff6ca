package postgres

import "github.com/chargeonce/chargeonce/internal/migrations"

// SchemaVersion is the version of the newest migration this build embeds:
// the schema Migrate brings a database to. `chargeonce version` prints it.
func SchemaVersion() (int, error) {
	ms, err := migrations.Load(migrationFS, "migrations")
	if err != nil {
		return 0, err
	}
	if len(ms) == 0 {
		return 0, nil
	}
	return ms[len(ms)-1].Version, nil
}
