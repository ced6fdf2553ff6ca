package postgres_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/internal/pgtest"
)

// TestMigration0017OnData: a database as 0016 left it, with a captured
// charge partly refunded and a processing charge with its record: after
// Migrate (twice: it is idempotent) the rows are intact, the processing
// charge settles with its charge.captured event as before, the new
// statuses are accepted and the old CHECK is gone, and the database refuses
// a captured amount past the authorized one and refunds past the captured
// amount.
func TestMigration0017OnData(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.URL(t)
	s := open(t, url)
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	// Back to 0016: what 0017 added goes, and 0017 is forgotten.
	for _, q := range []string{
		`DROP TABLE charge_operations`,
		`DROP INDEX charges_authorized_created_idx`,
		`ALTER TABLE charges DROP CONSTRAINT charges_refunded_captured_check`,
		`ALTER TABLE charges DROP CONSTRAINT charges_captured_cents_check`,
		`ALTER TABLE charges DROP CONSTRAINT charges_capture_method_check`,
		`ALTER TABLE charges DROP CONSTRAINT charges_status_check_v2`,
		`ALTER TABLE charges ADD CONSTRAINT charges_status_check CHECK (status IN ('processing', 'captured', 'declined'))`,
		`ALTER TABLE charges DROP COLUMN capture_method`,
		`ALTER TABLE charges DROP COLUMN captured_cents`,
		`CREATE OR REPLACE FUNCTION charges_settlement_events() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO webhook_events (id, merchant_id, charge_id, type)
    SELECT 'evt_' || substr(n.id, 4), n.merchant_id, n.id, 'charge.' || n.status
    FROM settled_new n JOIN settled_old o ON o.id = n.id
    WHERE o.status = 'processing' AND n.status IN ('captured', 'declined')
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END
$$`,
		`DELETE FROM schema_migrations WHERE version = 17`,
		`DELETE FROM schema_migration_steps WHERE version = 17`,
		`INSERT INTO charges (id, merchant_id, idempotency_key, order_id, amount_cents, currency, payment_token, status, refunded_cents)
			VALUES ('ch_old', 'm', 'k-old', 1, 100, 'BRL', 'tok_ok', 'captured', 30),
			       ('ch_proc', 'm', 'k-proc', 2, 50, 'BRL', 'tok_ok', 'processing', 0)`,
		`INSERT INTO idempotency_keys (merchant_id, key, fingerprint, token, state, lease_until, charge_id)
			VALUES ('m', 'k-proc', 'fp', 'tok-proc', 'processing', now() + interval '1 hour', 'ch_proc')`,
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("preparing the 0016 database: %s: %v", q, err)
		}
	}
	for range 2 {
		if err := s.Migrate(ctx); err != nil {
			t.Fatalf("Migrate: %v", err)
		}
	}
	old, err := s.ChargeGet(ctx, "m", "ch_old")
	if err != nil || old.Status != chargeonce.StatusCaptured || old.AmountCaptured() != 100 || old.CaptureMethod != "" {
		t.Fatalf("ch_old read back: %+v, %v", old, err)
	}
	if err := s.KeyComplete(ctx, chargeonce.KeyCompleteParams{MerchantID: "m", Key: "k-proc", Token: "tok-proc",
		ChargeStatus: chargeonce.StatusCaptured, ResponseStatus: 201, ResponseBody: []byte(`{}`), TTL: 3600e9}); err != nil {
		t.Fatalf("settling the 0016 record: %v", err)
	}
	var events int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM webhook_events WHERE charge_id = 'ch_proc' AND type = 'charge.captured'`).Scan(&events); err != nil {
		t.Fatal(err)
	}
	if events != 1 {
		t.Fatalf("%d charge.captured events for the settled 0016 charge; want 1", events)
	}
	if _, err := conn.Exec(ctx, `UPDATE charges SET status = 'authorized', capture_method = 'manual' WHERE id = 'ch_proc'`); err != nil {
		t.Fatalf("status authorized refused after Migrate: %v", err)
	}
	for _, q := range []string{
		`UPDATE charges SET status = 'bogus' WHERE id = 'ch_proc'`,
		`UPDATE charges SET captured_cents = 51 WHERE id = 'ch_proc'`,
		`UPDATE charges SET capture_method = 'later' WHERE id = 'ch_proc'`,
		`UPDATE charges SET captured_cents = 20 WHERE id = 'ch_old'`, // 30 refunded
	} {
		if _, err := conn.Exec(ctx, q); err == nil {
			t.Fatalf("%s: accepted after Migrate", q)
		}
	}
}
