package postgres_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/chargeonce/chargeonce/internal/pgtest"
)

// TestMigration0013OnData: a database as 0012 left it, where redeliveries
// queued an event three times to one endpoint and twice to another, beside
// a delivery done and one pending alone: after Migrate each (event,
// endpoint) has one pending delivery, the oldest, the others failed, and a
// fourth pending one is refused by the database.
func TestMigration0013OnData(t *testing.T) {
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
	// Back to 0012: the unique index goes, and 0013 is forgotten.
	for _, q := range []string{
		`DROP INDEX webhook_deliveries_one_pending`,
		`DROP INDEX webhook_deliveries_endpoint_due`,
		`CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_at, id) WHERE state = 'pending'`,
		`DROP INDEX webhook_deliveries_endpoint_failed`,
		`ALTER TABLE webhook_endpoints DROP COLUMN enabled_events`,
		`CREATE INDEX webhook_deliveries_endpoint ON webhook_deliveries (endpoint_id) WHERE state = 'pending'`,
		`DELETE FROM schema_migrations WHERE version = 13`,
		`INSERT INTO webhook_deliveries (event_id, endpoint_id, merchant_id, state) VALUES
			('evt_a', 'we_1', 'm', 'pending'), ('evt_a', 'we_1', 'm', 'pending'), ('evt_a', 'we_1', 'm', 'pending'),
			('evt_a', 'we_2', 'm', 'pending'), ('evt_a', 'we_2', 'm', 'pending'),
			('evt_b', 'we_1', 'm', 'succeeded'), ('evt_b', 'we_1', 'm', 'pending')`,
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("preparing the 0012 database: %s: %v", q, err)
		}
	}
	for range 2 {
		if err := s.Migrate(ctx); err != nil {
			t.Fatalf("Migrate: %v", err)
		}
		rows, err := conn.Query(ctx, `SELECT id, state FROM webhook_deliveries ORDER BY id`)
		if err != nil {
			t.Fatal(err)
		}
		type row struct {
			ID    int64
			State string
		}
		got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
		if err != nil {
			t.Fatal(err)
		}
		want := []string{"pending", "failed", "failed", "pending", "failed", "succeeded", "pending"}
		if len(got) != len(want) {
			t.Fatalf("deliveries after Migrate: %+v", got)
		}
		for i, w := range want {
			if got[i].State != w {
				t.Fatalf("deliveries after Migrate: %+v; want states %v", got, want)
			}
		}
	}
	if _, err := conn.Exec(ctx, `INSERT INTO webhook_deliveries (event_id, endpoint_id, merchant_id) VALUES ('evt_a', 'we_1', 'm')`); err == nil {
		t.Fatal("a second pending delivery of evt_a to we_1 was accepted")
	}
}
