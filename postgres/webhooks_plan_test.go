package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/internal/pgtest"
)

// TestWebhookClaimAndFinishReadTheirDeliveriesByID pins the plans of the
// sender's two statements on a long-running instance: planned, then cached
// as generic plans, while webhook_deliveries was small, a claim's UPDATE
// and a finish's UPDATE must still find their deliveries by primary key
// once another merchant has 40,000 pending (not yet due). With state =
// 'pending' written as a constant, PostgreSQL could prove the partial
// indexes' predicate and, with few pending rows in its estimates, walk
// every pending delivery of every merchant (a bitmap scan of
// webhook_deliveries_one_pending) to update the few it claimed or
// finished: a cost that grew with other merchants' backlogs (seen under
// bench --webhooks: 525 rows read to finish 5).
func TestWebhookClaimAndFinishReadTheirDeliveriesByID(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	connURL := pgtest.URL(t)
	s := open(t, connURL)
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	pool := s.Pool()
	var schema string
	if err := pool.QueryRow(ctx, "SELECT current_schema()").Scan(&schema); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "ALTER TABLE webhook_deliveries SET (autovacuum_enabled = false)"); err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{"busy", "calm"} {
		if _, err := s.WebhookEndpointCreate(ctx, chargeonce.WebhookEndpoint{ID: "we_" + m, MerchantID: m, URL: "https://example.com", Secret: "whsec_x"}); err != nil {
			t.Fatal(err)
		}
	}
	// owe queues n of calm's events, due now.
	seq := 0
	owe := func(n int) {
		t.Helper()
		// The fan-out trigger owes each event to calm's endpoint.
		if _, err := pool.Exec(ctx, `
INSERT INTO webhook_events (id, merchant_id, charge_id, type)
SELECT 'evt_calm_' || g, 'calm', 'ch_calm_' || g, 'charge.captured' FROM generate_series($1::int, $2::int) g`, seq+1, seq+n); err != nil {
			t.Fatal(err)
		}
		seq += n
	}
	// deliver claims calm's due deliveries and records them delivered.
	deliver := func(want int) {
		t.Helper()
		ds, err := s.WebhookDeliveriesClaim(ctx, time.Minute, 64, 64, nil)
		if err != nil || len(ds) != want {
			t.Fatalf("claimed %d deliveries (%v), want %d", len(ds), err, want)
		}
		fs := make([]chargeonce.WebhookFinish, len(ds))
		for i, d := range ds {
			fs[i] = chargeonce.WebhookFinish{Delivery: d, Outcome: chargeonce.WebhookOutcome{
				Delivered: true, Attempt: chargeonce.WebhookAttempt{StatusCode: 204, Latency: time.Millisecond}}}
		}
		s.WebhookDeliveriesFinish(ctx, fs)
		for _, f := range fs {
			if f.Err != nil {
				t.Fatalf("finishing delivery %d: %v", f.Delivery.ID, f.Err)
			}
		}
	}
	// What the sender's pool read is published when its sessions end (an
	// idle session waits 10 s before it reports): the count runs from
	// before the first claim to after the store is closed, on a
	// connection of its own.
	admin, err := pgx.Connect(ctx, connURL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	read := func() int64 {
		var seq, idx int64
		if err := admin.QueryRow(ctx, `SELECT coalesce(seq_tup_read, 0), coalesce(idx_tup_fetch, 0)
FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = 'webhook_deliveries'`, schema).Scan(&seq, &idx); err != nil {
			t.Fatal(err)
		}
		return seq + idx
	}
	// stable waits until the counts stop moving.
	stable := func() int64 {
		t.Helper()
		prev := int64(-1)
		for same := 0; same < 5; time.Sleep(50 * time.Millisecond) {
			n := read()
			if n == prev {
				same++
			} else {
				prev, same = n, 0
			}
		}
		return prev
	}
	flushStats(t, s)
	before := stable()
	// The sender's pool has two connections: enough rounds for each to
	// cache its generic plans on the small table.
	for range 16 {
		owe(4)
		deliver(4)
	}
	if _, err := pool.Exec(ctx, `
INSERT INTO webhook_deliveries (event_id, endpoint_id, merchant_id, next_at)
SELECT 'evt_busy_' || g, 'we_busy', 'busy', now() + interval '1 hour' FROM generate_series(1, 40000) g`); err != nil {
		t.Fatal(err)
	}
	const rounds, per = 10, 4
	for range rounds {
		owe(per)
		deliver(per)
	}
	s.Close()
	// Both phases are counted: on the small table a claim and a finish
	// read a few rows each whatever their plans.
	perDelivery := float64(stable()-before) / (rounds * per)
	t.Logf("%.1f delivery rows read a delivery claimed and finished, beside another merchant's 40,000 pending", perDelivery)
	if perDelivery > 20 {
		t.Fatalf("a delivery claimed and finished read %.0f delivery rows beside another merchant's 40,000 pending (plans cached on a small table); want a few, by primary key", perDelivery)
	}
}
