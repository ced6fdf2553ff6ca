package postgres_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/internal/pgtest"
)

// TestMigration0018OnData: a database as 0017 left it, with an endpoint
// written by the previous release: after Migrate (twice) it reads with the
// default concurrency, takes a max_concurrency, and the previous release's
// insert (which names no max_concurrency) still works beside it.
func TestMigration0018OnData(t *testing.T) {
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
	insertOld := `INSERT INTO webhook_endpoints (id, merchant_id, url, description, secret, enabled_events)
		VALUES ($1, 'm', 'https://example.com/hook', 'old', 'whsec_x', NULL)`
	for _, q := range []string{
		`ALTER TABLE webhook_endpoints DROP COLUMN max_concurrency`,
		`DELETE FROM schema_migrations WHERE version = 18`,
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("preparing the 0017 database: %s: %v", q, err)
		}
	}
	if _, err := conn.Exec(ctx, insertOld, "we_old"); err != nil {
		t.Fatalf("preparing the 0017 database: %v", err)
	}
	for range 2 {
		if err := s.Migrate(ctx); err != nil {
			t.Fatalf("Migrate: %v", err)
		}
	}
	es, err := s.WebhookEndpointsList(ctx, "m")
	if err != nil || len(es) != 1 || es[0].MaxConcurrency != 0 || es[0].Concurrency() != chargeonce.DefaultEndpointConcurrency {
		t.Fatalf("the previous release's endpoint after Migrate: %+v, %v", es, err)
	}
	n := 3
	if e, err := s.WebhookEndpointUpdate(ctx, "m", "we_old", chargeonce.WebhookEndpointUpdate{MaxConcurrency: &n}); err != nil || e.MaxConcurrency != 3 {
		t.Fatalf("setting max_concurrency: %+v, %v", e, err)
	}
	if _, err := conn.Exec(ctx, insertOld, "we_old2"); err != nil {
		t.Fatalf("the previous release's insert after 0018: %v", err)
	}
	if _, err := conn.Exec(ctx, `UPDATE webhook_endpoints SET max_concurrency = 65 WHERE id = 'we_old2'`); err == nil {
		t.Fatal("max_concurrency 65 accepted by the database")
	}
}
