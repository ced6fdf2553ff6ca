package sqlite_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// schemaAt applies the migration files up to version (inclusive) to db the
// way the release that shipped them did, and records them in
// schema_migrations, so that a test starts from a file an older release left
// behind. Versions with no file (SQLite has no 0004) are skipped.
func schemaAt(t testing.TB, db *sql.DB, version int) {
	t.Helper()
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, `CREATE TABLE schema_migrations (version INTEGER NOT NULL PRIMARY KEY, name TEXT NOT NULL, applied_at INTEGER NOT NULL) STRICT`); err != nil {
		t.Fatalf("creating schema_migrations: %v", err)
	}
	for v := 1; v <= version; v++ {
		names, err := filepath.Glob(fmt.Sprintf("migrations/%04d_*.sql", v))
		if err != nil {
			t.Fatal(err)
		}
		if len(names) == 0 {
			continue
		}
		q, err := os.ReadFile(names[0])
		if err != nil {
			t.Fatal(err)
		}
		if _, err := db.ExecContext(ctx, string(q)); err != nil {
			t.Fatalf("applying %s: %v", names[0], err)
		}
		if _, err := db.ExecContext(ctx, `INSERT INTO schema_migrations VALUES (?1, ?2, 0)`, v, filepath.Base(names[0])); err != nil {
			t.Fatalf("recording %s: %v", names[0], err)
		}
	}
}

// TestMigration0005OnData applies 0005 to a file at 0003 holding a record
// 0002 under-fixed: created 20 h ago with a TTL of 24 h, settled 1 h ago, it
// kept the expiry its insert fixed (4 h from now). After 0005 it expires a
// whole TTL after its settlement (23 h from now). A record already expiring
// a TTL after its settlement keeps about that.
func TestMigration0005OnData(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "old.db")
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	schemaAt(t, db, 4)
	const now = `(CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER) * 1000)`
	const hour = 3600 * 1000000
	if _, err := db.ExecContext(ctx, `INSERT INTO charges (id, merchant_id, idempotency_key, order_id, amount_cents, currency, payment_token, status, created_at, updated_at)
		VALUES ('ch_e', 'm', 'early', 1, 100, 'BRL', 'tok_ok', 'captured', 0, 0), ('ch_f', 'm', 'fixed', 2, 100, 'BRL', 'tok_ok', 'captured', 0, 0)`); err != nil {
		t.Fatalf("preparing the 0003 file: %v", err)
	}
	if _, err := db.ExecContext(ctx, fmt.Sprintf(`INSERT INTO idempotency_keys (merchant_id, key, fingerprint, token, state, lease_until, recovery_attempts, response_status, response_body, charge_id, created_at, updated_at, expires_at) VALUES
		('m', 'early', 'fp', 't1', 'completed', %[1]s, 0, 201, X'01', 'ch_e', %[1]s - 20*%[2]d, %[1]s - 1*%[2]d, %[1]s + 4*%[2]d),
		('m', 'fixed', 'fp', 't2', 'completed', %[1]s, 0, 201, X'02', 'ch_f', %[1]s - 2*%[2]d, %[1]s - 2*%[2]d + 10000, %[1]s - 2*%[2]d + 10000 + 24*%[2]d)`, now, hour)); err != nil {
		t.Fatalf("preparing the 0003 file: %v", err)
	}
	db.Close()

	st := openAt(t, path, true)
	early, err := st.KeyGet(ctx, "m", "early")
	if err != nil || early.ExpiresIn < 22*time.Hour+59*time.Minute || early.ExpiresIn > 23*time.Hour {
		t.Fatalf("record settled 1h ago with a 24h TTL, after migrate: expires in %v, err %v; want 23h", early.ExpiresIn, err)
	}
	fixed, err := st.KeyGet(ctx, "m", "fixed")
	if err != nil || fixed.ExpiresIn < 21*time.Hour+59*time.Minute || fixed.ExpiresIn > 22*time.Hour+time.Second {
		t.Fatalf("record settled 2h ago expiring 24h after, after migrate: expires in %v, err %v; want 22h", fixed.ExpiresIn, err)
	}
}
