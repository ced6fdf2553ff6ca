package sqlite_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/chargeonce/chargeonce"
)

// TestMigration0018OnData: a file before 0018 with an endpoint written by the
// previous release: after Migrate it reads with the default concurrency,
// takes a max_concurrency, and the previous release's insert (which names
// no max_concurrency) still works beside it.
func TestMigration0018OnData(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "old.db")
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	schemaAt(t, db, 17)
	insertOld := `INSERT INTO webhook_endpoints (id, merchant_id, url, description, secret, created_at, enabled_events)
		VALUES (?1, 'm', 'https://example.com/hook', 'old', 'whsec_x', 1, NULL)`
	if _, err := db.ExecContext(ctx, insertOld, "we_old"); err != nil {
		t.Fatalf("preparing the 0016 file: %v", err)
	}
	db.Close()

	s := openAt(t, path, true) // migrates
	es, err := s.WebhookEndpointsList(ctx, "m")
	if err != nil || len(es) != 1 || es[0].MaxConcurrency != 0 || es[0].Concurrency() != chargeonce.DefaultEndpointConcurrency {
		t.Fatalf("the previous release's endpoint after Migrate: %+v, %v", es, err)
	}
	n := 3
	if e, err := s.WebhookEndpointUpdate(ctx, "m", "we_old", chargeonce.WebhookEndpointUpdate{MaxConcurrency: &n}); err != nil || e.MaxConcurrency != 3 {
		t.Fatalf("setting max_concurrency: %+v, %v", e, err)
	}
	db, err = sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, insertOld, "we_old2"); err != nil {
		t.Fatalf("the previous release's insert after 0018: %v", err)
	}
	if _, err := db.ExecContext(ctx, `UPDATE webhook_endpoints SET max_concurrency = 65 WHERE id = 'we_old2'`); err == nil {
		t.Fatal("max_concurrency 65 accepted by the database")
	}
}
