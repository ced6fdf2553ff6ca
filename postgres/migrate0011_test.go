package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/chargeonce/chargeonce/internal/pgtest"
)

// TestMigration0011OnData migrates a database release v0.3.0 left (schema
// 0004), holding charges its statements settled, which have no event, and a
// charge still processing: after Migrate each settled charge has exactly one
// event of its outcome, dated when the charge settled, with no delivery (no
// endpoint exists yet), and the processing charge has none; a second Migrate
// changes nothing.
func TestMigration0011OnData(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.URL(t)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	schemaAt(t, conn, 4)
	if _, err := conn.Exec(ctx, `INSERT INTO charges (id, merchant_id, idempotency_key, order_id, amount_cents, currency, payment_token, status, decline_code, updated_at)
		VALUES ('ch_c', 'm', 'captured', 1, 100, 'BRL', 'tok_ok', 'captured', NULL, now() - interval '2h'),
		       ('ch_d', 'n', 'declined', 2, 100, 'BRL', 'tok_declined', 'declined', 'card_declined', now() - interval '1h'),
		       ('ch_p', 'm', 'processing', 3, 100, 'BRL', 'tok_ok', 'processing', NULL, now())`); err != nil {
		t.Fatalf("preparing the 0004 database: %v", err)
	}
	s := open(t, url)
	for range 2 {
		if err := s.Migrate(ctx); err != nil {
			t.Fatalf("Migrate: %v", err)
		}
		rows, err := conn.Query(ctx, `
SELECT e.id, e.charge_id, e.merchant_id, e.type, e.created_at = c.updated_at
FROM webhook_events e JOIN charges c ON c.id = e.charge_id ORDER BY e.charge_id`)
		if err != nil {
			t.Fatal(err)
		}
		type event struct {
			ID, ChargeID, MerchantID, Type string
			AtSettlement                   bool
		}
		got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[event])
		if err != nil {
			t.Fatal(err)
		}
		want := []event{{"evt_c", "ch_c", "m", "charge.captured", true}, {"evt_d", "ch_d", "n", "charge.declined", true}}
		if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
			t.Fatalf("events after Migrate: %+v; want %+v", got, want)
		}
		var deliveries int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM webhook_deliveries`).Scan(&deliveries); err != nil || deliveries != 0 {
			t.Fatalf("%d deliveries, %v; want none: no endpoint exists", deliveries, err)
		}
	}
	// The charge still processing gets its event when it settles.
	var settledAt time.Time
	if err := conn.QueryRow(ctx, `UPDATE charges SET status = 'captured', updated_at = now() WHERE id = 'ch_p' RETURNING updated_at`).Scan(&settledAt); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM webhook_events WHERE charge_id = 'ch_p' AND type = 'charge.captured' AND created_at = $1`, settledAt).Scan(&n); err != nil || n != 1 {
		t.Fatalf("events of ch_p after it settled: %d, %v; want 1", n, err)
	}
}
