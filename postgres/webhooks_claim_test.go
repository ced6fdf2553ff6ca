package postgres_test

import (
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/internal/pgtest"
)

// TestWebhookClaimReadsNoOtherBacklog counts the delivery rows a claim
// reads (pg_stat_user_tables) with 50,000 deliveries due to a merchant it
// skips (held at its limit) and one due to another: it reads a handful,
// not the backlog. Before 0013 the claim read the due deliveries in
// next_at order and filtered the skipped merchant's out one by one (seen:
// 50,004 rows read for one delivery claimed).
func TestWebhookClaimReadsNoOtherBacklog(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s := open(t, pgtest.URL(t))
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	pool := s.Pool()
	for _, m := range []string{"busy", "calm"} {
		if _, err := s.WebhookEndpointCreate(ctx, chargeonce.WebhookEndpoint{ID: "we_" + m, MerchantID: m, URL: "https://example.com", Secret: "whsec_x"}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, `
INSERT INTO webhook_deliveries (event_id, endpoint_id, merchant_id, next_at)
SELECT 'evt_busy' || g, 'we_busy', 'busy', now() - interval '1 hour' FROM generate_series(1, 50000) g`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO webhook_events (id, merchant_id, charge_id, type) VALUES ('evt_calm', 'calm', 'ch_calm', 'charge.captured')`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `ANALYZE webhook_deliveries`); err != nil {
		t.Fatal(err)
	}
	read := func() int64 {
		flushStats(t, s)
		var n int64
		var seq, idx int64
		if err := pool.QueryRow(ctx, `SELECT coalesce(seq_tup_read, 0), coalesce(idx_tup_fetch, 0)
FROM pg_stat_user_tables WHERE schemaname = current_schema() AND relname = 'webhook_deliveries'`).Scan(&seq, &idx); err != nil {
			t.Fatal(err)
		}
		n = seq + idx
		return n
	}
	// Statistics from the setup are published before the count starts.
	for prev, same := int64(-1), 0; same < 5; time.Sleep(50 * time.Millisecond) {
		n := read()
		if n == prev {
			same++
		} else {
			prev, same = n, 0
		}
	}
	before := read()
	ds, err := s.WebhookDeliveriesClaim(ctx, time.Minute, 32, 4, []string{"busy"})
	if err != nil || len(ds) != 1 || ds[0].Event.MerchantID != "calm" {
		t.Fatalf("claim = %+v, %v; want calm's one delivery", ds, err)
	}
	if n := read() - before; n > 100 {
		t.Fatalf("the claim read %d delivery rows for one delivery, behind a skipped merchant's 50,000", n)
	}
}
