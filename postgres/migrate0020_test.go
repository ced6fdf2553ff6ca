package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/internal/pgtest"
)

// TestMigration0020OnData: a database as the release before left it, with
// a captured charge and its refund: after Migrate (twice: it is
// idempotent) reconciliation reads the refund by its charge through the new
// index, and a run's shares and their events can be stored.
func TestMigration0020OnData(t *testing.T) {
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
	// Back to before 0020.
	for _, q := range []string{
		`DROP INDEX refunds_charge_reference`,
		`DROP TABLE recon_run_merchants`,
		`DELETE FROM schema_migrations WHERE version >= 20`,
		`INSERT INTO charges (id, merchant_id, idempotency_key, order_id, amount_cents, currency, payment_token, status)
		 VALUES ('ch_old', 'm', 'k', 1, 2500, 'BRL', 'tok', 'captured')`,
		`INSERT INTO refunds (id, merchant_id, idempotency_key, charge_id, amount_cents, currency, status)
		 VALUES ('re_old', 'm', 'rk', 'ch_old', 1000, 'BRL', 'succeeded')`,
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("preparing the database before 0020: %s: %v", q, err)
		}
	}
	for range 2 {
		if err := s.Migrate(ctx); err != nil {
			t.Fatalf("Migrate: %v", err)
		}
	}
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_indexes WHERE indexname = 'refunds_charge_reference' AND schemaname = current_schema()`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("refunds_charge_reference after Migrate: %d %v", n, err)
	}
	day := time.Now().Add(-time.Hour)
	got, err := s.RefundsListByChargeReference(ctx, chargeonce.ReconRefundsParams{From: day, To: day.Add(2 * time.Hour), Limit: 10})
	if err != nil || len(got) != 1 || got[0].ID != "re_old" || got[0].ChargeID != "ch_old" {
		t.Fatalf("refunds after 0020: %+v %v", got, err)
	}
	if _, err := s.ReconRunSave(ctx, chargeonce.ReconRun{Acquirer: "sim", Period: "p", From: day, To: day.Add(time.Hour), Counts: map[string]int{},
		Merchants: []chargeonce.ReconMerchantRun{{MerchantID: "m", Counts: map[string]int{}}}}); err != nil {
		t.Fatalf("storing a run after 0020: %v", err)
	}
}
