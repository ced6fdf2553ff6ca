package sqlite_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"
)

// TestMigration0011OnData migrates a file at 0010 where a merchant without
// an endpoint had charges settled with no event (0010's trigger wrote one
// only for a merchant with an enabled endpoint), beside a merchant whose
// charge has its event and delivery, and a charge still processing: after
// Migrate each settled charge has exactly one event of its outcome, the new
// ones dated when their charge settled and with no delivery, and the
// processing charge has none.
func TestMigration0011OnData(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "old.db")
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	schemaAt(t, db, 10)
	for _, q := range []string{
		`INSERT INTO webhook_endpoints (id, merchant_id, url, secret, created_at) VALUES ('we_h', 'hooked', 'https://example.com/hook', 'whsec_x', 1)`,
		`INSERT INTO charges (id, merchant_id, idempotency_key, order_id, amount_cents, currency, payment_token, status, created_at, updated_at) VALUES
			('ch_h', 'hooked', 'k1', 1, 100, 'BRL', 'tok_ok', 'processing', 10, 10),
			('ch_c', 'none', 'k2', 2, 100, 'BRL', 'tok_ok', 'processing', 10, 10),
			('ch_d', 'none', 'k3', 3, 100, 'BRL', 'tok_declined', 'processing', 10, 10),
			('ch_p', 'none', 'k4', 4, 100, 'BRL', 'tok_ok', 'processing', 10, 10)`,
		`UPDATE charges SET status = 'captured', updated_at = 1000 WHERE id IN ('ch_h', 'ch_c')`,
		`UPDATE charges SET status = 'declined', decline_code = 'card_declined', updated_at = 2000 WHERE id = 'ch_d'`,
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatalf("preparing the 0010 file: %v", err)
		}
	}
	var before int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM webhook_events`).Scan(&before); err != nil || before != 1 {
		t.Fatalf("events at 0010: %d, %v; want the hooked merchant's only", before, err)
	}
	db.Close()

	openAt(t, path, true) // migrates
	db, err = sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rows, err := db.QueryContext(ctx, `
SELECT e.id, e.charge_id, e.type, e.created_at = c.updated_at
FROM webhook_events e JOIN charges c ON c.id = e.charge_id ORDER BY e.charge_id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	type event struct {
		id, chargeID, typ string
		atSettlement      bool
	}
	var got []event
	for rows.Next() {
		var e event
		if err := rows.Scan(&e.id, &e.chargeID, &e.typ, &e.atSettlement); err != nil {
			t.Fatal(err)
		}
		got = append(got, e)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	want := []event{{"evt_c", "ch_c", "charge.captured", true}, {"evt_d", "ch_d", "charge.declined", true}, {"evt_h", "ch_h", "charge.captured", false}}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] || got[2].id != want[2].id || got[2].typ != want[2].typ {
		t.Fatalf("events after Migrate: %+v; want %+v", got, want)
	}
	var deliveries int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM webhook_deliveries WHERE event_id = 'evt_h'`).Scan(&deliveries); err != nil || deliveries != 1 {
		t.Fatalf("deliveries: %d, %v; want the hooked merchant's one", deliveries, err)
	}
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM webhook_deliveries`).Scan(&deliveries); err != nil || deliveries != 1 {
		t.Fatalf("deliveries: %d, %v; want 1", deliveries, err)
	}
}
