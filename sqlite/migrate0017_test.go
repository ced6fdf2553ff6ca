package sqlite_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/chargeonce/chargeonce"
)

// TestMigration0017OnData: a file at 0016 with a captured charge partly
// refunded, a processing charge and its record, and an endpoint filtering
// its events: after Migrate (which rebuilds charges) the rows, their rowids
// and refunded amounts are intact, the processing charge still settles
// with its event fanned out only to the endpoint that asked for it, a
// manual charge can be authorized and captured, and a refund past the
// captured amount is refused by the new CHECK.
func TestMigration0017OnData(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "old.db")
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	schemaAt(t, db, 16)
	for _, q := range []string{
		`INSERT INTO charges (rowid, id, merchant_id, idempotency_key, order_id, amount_cents, currency, payment_token, description, status, created_at, updated_at, refunded_cents)
			VALUES (7, 'ch_old', 'm', 'k-old', 1, 100, 'BRL', 'tok_ok', '', 'captured', 1, 1, 30)`,
		`INSERT INTO charges (rowid, id, merchant_id, idempotency_key, order_id, amount_cents, currency, payment_token, description, status, created_at, updated_at)
			VALUES (9, 'ch_proc', 'm', 'k-proc', 2, 50, 'BRL', 'tok_ok', '', 'processing', 2, 2)`,
		`INSERT INTO idempotency_keys (merchant_id, key, fingerprint, token, state, lease_until, recovery_attempts, charge_id, created_at, updated_at)
			VALUES ('m', 'k-proc', 'fp', 'tok-proc', 'processing', 9999999999999999, 0, 'ch_proc', 2, 2)`,
		`INSERT INTO webhook_endpoints (id, merchant_id, url, secret, status, created_at, enabled_events)
			VALUES ('we_all', 'm', 'http://127.0.0.1:1/a', 'whsec_a', 'enabled', 1, NULL),
			       ('we_refunds', 'm', 'http://127.0.0.1:1/b', 'whsec_b', 'enabled', 1, '["charge.refunded"]')`,
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatalf("preparing the 0016 file: %s: %v", q, err)
		}
	}
	db.Close()

	s := openAt(t, path, true) // migrates
	db, err = sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var rowid, refunded int64
	var method sql.NullString
	if err := db.QueryRowContext(ctx, `SELECT rowid, refunded_cents, capture_method FROM charges WHERE id = 'ch_old'`).Scan(&rowid, &refunded, &method); err != nil {
		t.Fatal(err)
	}
	if rowid != 7 || refunded != 30 || method.Valid {
		t.Fatalf("ch_old after Migrate: rowid %d, refunded %d, capture_method %v; want 7, 30, NULL", rowid, refunded, method)
	}
	old, err := s.ChargeGet(ctx, "m", "ch_old")
	if err != nil || old.Status != chargeonce.StatusCaptured || old.AmountCaptured() != 100 || old.CaptureMethod != "" {
		t.Fatalf("ch_old read back: %+v, %v", old, err)
	}
	// The processing charge settles as before; its event reaches the
	// endpoint that takes every event, not the one filtering for refunds.
	if err := s.KeyComplete(ctx, chargeonce.KeyCompleteParams{MerchantID: "m", Key: "k-proc", Token: "tok-proc",
		ChargeStatus: chargeonce.StatusCaptured, ResponseStatus: 201, ResponseBody: []byte(`{}`), TTL: 3600e9}); err != nil {
		t.Fatalf("settling the 0016 record: %v", err)
	}
	var events, toAll, toRefunds int
	if err := db.QueryRowContext(ctx, `SELECT
		(SELECT count(*) FROM webhook_events WHERE charge_id = 'ch_proc' AND type = 'charge.captured'),
		(SELECT count(*) FROM webhook_deliveries WHERE endpoint_id = 'we_all'),
		(SELECT count(*) FROM webhook_deliveries WHERE endpoint_id = 'we_refunds')`).Scan(&events, &toAll, &toRefunds); err != nil {
		t.Fatal(err)
	}
	if events != 1 || toAll != 1 || toRefunds != 0 {
		t.Fatalf("after settling: %d events, %d deliveries to we_all, %d to we_refunds; want 1, 1, 0", events, toAll, toRefunds)
	}
	// The new statuses and the CHECKs.
	if _, err := db.ExecContext(ctx, `UPDATE charges SET status = 'authorized' WHERE id = 'ch_proc'`); err != nil {
		t.Fatalf("status authorized refused after Migrate: %v", err)
	}
	if _, err := db.ExecContext(ctx, `UPDATE charges SET status = 'bogus' WHERE id = 'ch_proc'`); err == nil {
		t.Fatal("status bogus accepted")
	}
	if _, err := db.ExecContext(ctx, `UPDATE charges SET status = 'captured', capture_method = 'manual', captured_cents = 20 WHERE id = 'ch_old'`); err == nil {
		t.Fatal("refunded 30 of a capture of 20 accepted")
	}
	if _, err := db.ExecContext(ctx, `UPDATE charges SET captured_cents = 101 WHERE id = 'ch_old'`); err == nil {
		t.Fatal("captured 101 of an authorization of 100 accepted")
	}
	var n int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_schema WHERE tbl_name = 'charges' AND type IN ('index', 'trigger')`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 5 { // the primary key's, two listing indexes, the sweeper's, the settlement trigger
		t.Fatalf("charges has %d indexes and triggers after Migrate; want 5", n)
	}
}
