package sqlite_test

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
)

// TestMigration0002OnData applies 0002 to a database file written under
// 0001: the table is rebuilt with a nullable expires_at, a processing record
// loses its expiry, a completed record settled after the expiry fixed at
// its insert (settled late, by recovery) is kept for its TTL from the
// settlement, other completed records keep theirs, and the indexes are back.
func TestMigration0002OnData(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "old.db")
	schema0001, err := os.ReadFile("migrations/0001_init.sql")
	if err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	const now = `(CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER) * 1000)`
	for _, q := range []string{
		string(schema0001),
		`CREATE TABLE schema_migrations (version INTEGER NOT NULL PRIMARY KEY, name TEXT NOT NULL, applied_at INTEGER NOT NULL) STRICT`,
		`INSERT INTO schema_migrations VALUES (1, '0001_init', 0)`,
		`INSERT INTO charges (id, merchant_id, idempotency_key, order_id, amount_cents, currency, payment_token, status, created_at, updated_at) VALUES
		 ('ch_p', 'm', 'processing', 1, 100, 'BRL', 'tok_ok', 'processing', 0, 0),
		 ('ch_l', 'm', 'late', 2, 100, 'BRL', 'tok_ok', 'captured', 0, 0),
		 ('ch_o', 'm', 'old', 3, 100, 'BRL', 'tok_ok', 'captured', 0, 0)`,
		// TTL 2s for all three; "late" was created 10s ago and completed
		// 1s ago, 7s after the expiry its insert fixed.
		`INSERT INTO idempotency_keys (merchant_id, key, fingerprint, token, state, lease_until, recovery_attempts, response_status, response_body, charge_id, created_at, updated_at, expires_at) VALUES
		 ('m', 'processing', 'fp', 't1', 'processing', ` + now + ` - 1*1000000, 0, NULL, NULL, 'ch_p', ` + now + ` - 10*1000000, ` + now + ` - 10*1000000, ` + now + ` - 8*1000000),
		 ('m', 'late', 'fp', 't2', 'completed', ` + now + `, 0, 201, X'6c617465', 'ch_l', ` + now + ` - 10*1000000, ` + now + ` - 1*1000000, ` + now + ` - 8*1000000),
		 ('m', 'old', 'fp', 't3', 'completed', ` + now + `, 0, 201, X'6f6c64', 'ch_o', ` + now + ` - 10*1000000, ` + now + ` - 9*1000000, ` + now + ` - 8*1000000)`,
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatalf("preparing the 0001 database: %v", err)
		}
	}
	db.Close()

	st := openAt(t, path, true)
	p, err := st.KeyGet(ctx, "m", "processing")
	if err != nil || !p.ExpiresAt.IsZero() {
		t.Fatalf("processing record after 0002: expires %v, err %v; want no expiry", p.ExpiresAt, err)
	}
	// 0002 gives it its 2s TTL from its settlement 1s ago; 0005 then
	// counts that TTL as expires_at - created_at (11s) from the settlement:
	// kept 9s longer, never shorter.
	late, err := st.KeyGet(ctx, "m", "late")
	if err != nil || late.ExpiresIn <= 0 || late.ExpiresIn > 10*time.Second {
		t.Fatalf("late record after 0002: expires in %v, err %v; want at least its 2s TTL counted from its settlement 1s ago, at most 10s", late.ExpiresIn, err)
	}
	if n, err := st.KeysDeleteExpired(ctx, 100); err != nil || n != 1 {
		t.Fatalf("KeysDeleteExpired after 0002: %d, %v; want only the old record", n, err)
	}
	if err := st.KeyComplete(ctx, chargeonce.KeyCompleteParams{MerchantID: "m", Key: "processing", Token: "t1",
		ChargeStatus: chargeonce.StatusCaptured, ResponseStatus: 201, ResponseBody: []byte("x"), TTL: time.Hour}); err != nil {
		t.Fatalf("KeyComplete after 0002: %v", err)
	}
	if p, err := st.KeyGet(ctx, "m", "processing"); err != nil || p.ExpiresIn < 59*time.Minute {
		t.Fatalf("settled record: expires in %v, err %v; want an hour", p.ExpiresIn, err)
	}
	w, _ := st.DBs()
	var indexes int
	if err := w.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_master WHERE type = 'index' AND tbl_name = 'idempotency_keys' AND name IN ('idempotency_keys_processing_lease', 'idempotency_keys_completed_expires_at')`).Scan(&indexes); err != nil || indexes != 2 {
		t.Fatalf("indexes after 0002: %d, %v; want both", indexes, err)
	}
}
