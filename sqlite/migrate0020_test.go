package sqlite_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
)

// TestMigration0020OnData: a file as the release before left it, with a
// captured charge and its refund: after Migrate (twice: it is idempotent)
// reconciliation reads the refund by its charge, and a run's shares and
// their events can be stored. 0020 only adds: the refund and the charge are
// untouched.
func TestMigration0020OnData(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "old.db")
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	schemaAt(t, db, 19)
	now := time.Now().UnixMicro()
	for _, q := range []string{
		`INSERT INTO charges (id, merchant_id, idempotency_key, order_id, amount_cents, currency, payment_token, status, created_at, updated_at)
		 VALUES ('ch_old', 'm', 'k', 1, 2500, 'BRL', 'tok', 'captured', ?1, ?1)`,
		`INSERT INTO refunds (id, merchant_id, idempotency_key, charge_id, amount_cents, currency, status, created_at, updated_at)
		 VALUES ('re_old', 'm', 'rk', 'ch_old', 1000, 'BRL', 'succeeded', ?1, ?1)`,
	} {
		if _, err := db.ExecContext(ctx, q, now); err != nil {
			t.Fatalf("preparing the file before 0020: %v", err)
		}
	}
	db.Close()
	openAt(t, path, true).Close()
	s := openAt(t, path, true) // twice
	defer s.Close()
	day := time.Now().Add(-time.Hour)
	got, err := s.RefundsListByChargeReference(ctx, chargeonce.ReconRefundsParams{From: day, To: day.Add(2 * time.Hour), Limit: 10})
	if err != nil || len(got) != 1 || got[0].ID != "re_old" || got[0].ChargeID != "ch_old" || got[0].Status != chargeonce.RefundSucceeded {
		t.Fatalf("refunds after 0020: %+v %v", got, err)
	}
	if _, err := s.ReconRunSave(ctx, chargeonce.ReconRun{Acquirer: "sim", Period: "p", From: day, To: day.Add(time.Hour), Counts: map[string]int{},
		Merchants: []chargeonce.ReconMerchantRun{{MerchantID: "m", Counts: map[string]int{}}}}); err != nil {
		t.Fatalf("storing a run after 0020: %v", err)
	}
}
