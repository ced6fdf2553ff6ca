package postgres_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/internal/pgtest"
)

// TestMigration0002OnData applies 0002 to a database written under 0001:
// a processing record loses its expiry (it is owed an answer), a completed
// record settled after the expiry fixed at its insert (settled late, by
// recovery) is kept for its TTL from the settlement, and other completed
// records keep theirs.
func TestMigration0002OnData(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.URL(t)
	schema0001, err := os.ReadFile("migrations/0001_init.sql")
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, sql := range []string{
		string(schema0001),
		`CREATE TABLE schema_migrations (version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`,
		`INSERT INTO schema_migrations (version, name) VALUES (1, '0001_init.sql')`,
		// TTL 2s for all three; "late" was created 10s ago and completed
		// 1s ago, 7s after the expiry its insert fixed.
		`INSERT INTO charges (id, merchant_id, idempotency_key, order_id, amount_cents, currency, payment_token, status)
		 VALUES ('ch_p', 'm', 'processing', 1, 100, 'BRL', 'tok_ok', 'processing'),
		        ('ch_l', 'm', 'late', 2, 100, 'BRL', 'tok_ok', 'captured'),
		        ('ch_o', 'm', 'old', 3, 100, 'BRL', 'tok_ok', 'captured')`,
		`INSERT INTO idempotency_keys (merchant_id, key, fingerprint, token, state, lease_until, response_status, response_body, charge_id, created_at, updated_at, expires_at) VALUES
		 ('m', 'processing', 'fp', 't1', 'processing', now() - interval '1s', NULL, NULL, 'ch_p', now() - interval '10s', now() - interval '10s', now() - interval '8s'),
		 ('m', 'late', 'fp', 't2', 'completed', now(), 201, 'late', 'ch_l', now() - interval '10s', now() - interval '1s', now() - interval '8s'),
		 ('m', 'old', 'fp', 't3', 'completed', now(), 201, 'old', 'ch_o', now() - interval '10s', now() - interval '9s', now() - interval '8s')`,
	} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("preparing the 0001 database: %v", err)
		}
	}
	s := open(t, url)
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("Migrate: %v", err)
	}

	p, err := s.KeyGet(ctx, "m", "processing")
	if err != nil || !p.ExpiresAt.IsZero() {
		t.Fatalf("processing record after 0002: expires %v, err %v; want no expiry", p.ExpiresAt, err)
	}
	// 0002 gives it its 2s TTL from its settlement 1s ago; 0005 then
	// counts that TTL as expires_at - created_at (11s) from the settlement:
	// kept 9s longer, never shorter.
	late, err := s.KeyGet(ctx, "m", "late")
	if err != nil || late.ExpiresIn <= 0 || late.ExpiresIn > 10*time.Second {
		t.Fatalf("late record after 0002: expires in %v, err %v; want at least its 2s TTL counted from its settlement 1s ago, at most 10s", late.ExpiresIn, err)
	}
	if n, err := s.KeysDeleteExpired(ctx, 100); err != nil || n != 1 {
		t.Fatalf("KeysDeleteExpired after 0002: %d, %v; want only the old record", n, err)
	}
	// The processing record is settled now, and expires its TTL later.
	if err := s.KeyComplete(ctx, chargeonce.KeyCompleteParams{MerchantID: "m", Key: "processing", Token: "t1",
		ChargeStatus: chargeonce.StatusCaptured, ResponseStatus: 201, ResponseBody: []byte("x"), TTL: time.Hour}); err != nil {
		t.Fatalf("KeyComplete after 0002: %v", err)
	}
	if p, err := s.KeyGet(ctx, "m", "processing"); err != nil || p.ExpiresIn < 59*time.Minute {
		t.Fatalf("settled record: expires in %v, err %v; want an hour", p.ExpiresIn, err)
	}
}
