package postgres_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/chargeonce/chargeonce/internal/pgtest"
)

// schemaAt applies the migration files of release v0.3.0 (testdata/v0.3.0,
// 0001 to 0004, as that release shipped them) up to version (inclusive) on
// conn, and records them in schema_migrations as that release did, so that a
// test starts from a database an older release left behind.
func schemaAt(t testing.TB, conn *pgx.Conn, version int) {
	t.Helper()
	ctx := context.Background()
	if _, err := conn.Exec(ctx, `CREATE TABLE schema_migrations (version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		t.Fatalf("creating schema_migrations: %v", err)
	}
	for v := 1; v <= version; v++ {
		names, err := filepath.Glob(fmt.Sprintf("testdata/v0.3.0/%04d_*.sql", v))
		if err != nil || len(names) != 1 {
			t.Fatalf("migration %04d: %v %v", v, names, err)
		}
		sql, err := os.ReadFile(names[0])
		if err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Exec(ctx, string(sql)); err != nil {
			t.Fatalf("applying %s: %v", names[0], err)
		}
		if _, err := conn.Exec(ctx, `INSERT INTO schema_migrations (version, name) VALUES ($1, $2)`, v, filepath.Base(names[0])); err != nil {
			t.Fatalf("recording %s: %v", names[0], err)
		}
	}
}

// TestMigration0005OnData applies 0005 to a database at 0004 holding a
// record 0002 under-fixed: created 20 h ago with a TTL of 24 h, settled 1 h
// ago, it kept the expiry its insert fixed (4 h from now). After 0005 it
// expires a whole TTL after its settlement (23 h from now). A record already
// expiring a TTL after its settlement keeps about that.
func TestMigration0005OnData(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.URL(t)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	schemaAt(t, conn, 4)
	if _, err := conn.Exec(ctx, `INSERT INTO charges (id, merchant_id, idempotency_key, order_id, amount_cents, currency, payment_token, status)
		VALUES ('ch_e', 'm', 'early', 1, 100, 'BRL', 'tok_ok', 'captured'), ('ch_f', 'm', 'fixed', 2, 100, 'BRL', 'tok_ok', 'captured')`); err != nil {
		t.Fatalf("preparing the 0004 database: %v", err)
	}
	if _, err := conn.Exec(ctx, `INSERT INTO idempotency_keys (merchant_id, key, fingerprint, token, state, lease_until, response_status, response_body, charge_id, created_at, updated_at, expires_at) VALUES
		('m', 'early', 'fp', 't1', 'completed', now(), 201, 'early', 'ch_e', now() - interval '20h', now() - interval '1h', now() + interval '4h'),
		('m', 'fixed', 'fp', 't2', 'completed', now(), 201, 'fixed', 'ch_f', now() - interval '2h', now() - interval '2h' + interval '10ms', now() - interval '2h' + interval '10ms' + interval '24h')`); err != nil {
		t.Fatalf("preparing the 0004 database: %v", err)
	}
	s := open(t, url)
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	early, err := s.KeyGet(ctx, "m", "early")
	if err != nil || early.ExpiresIn < 22*time.Hour+59*time.Minute || early.ExpiresIn > 23*time.Hour {
		t.Fatalf("record settled 1h ago with a 24h TTL, after migrate: expires in %v, err %v; want 23h", early.ExpiresIn, err)
	}
	fixed, err := s.KeyGet(ctx, "m", "fixed")
	if err != nil || fixed.ExpiresIn < 21*time.Hour+59*time.Minute || fixed.ExpiresIn > 22*time.Hour+time.Second {
		t.Fatalf("record settled 2h ago expiring 24h after, after migrate: expires in %v, err %v; want 22h", fixed.ExpiresIn, err)
	}
}
