package webhook_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/chargeonce/chargeonce/internal/apitest"
	"github.com/chargeonce/chargeonce/internal/pgtest"
	"github.com/chargeonce/chargeonce/webhook"
)

// millionBacklog is the backlog TestMillionBacklogBoundedMemory delivers
// from.
const millionBacklog = 1_000_000

// maxHeapUnderBacklog bounds the test binary's heap in use while the sender
// works through the backlog: far above what the sender holds (at most
// Workers deliveries, about 1 KB each), far below what loading the
// backlog would take (a million deliveries).
const maxHeapUnderBacklog = 128 << 20

// TestMillionBacklogBoundedMemory: one merchant has 1,000,000 deliveries
// due to an endpoint that answers at once; the sender works through them
// for a few seconds, and the heap stays bounded: it holds a claim's worth
// of deliveries at a time (Workers), never the backlog. The heap in use is
// sampled every 50 ms (docs/webhooks.md has the numbers).
func TestMillionBacklogBoundedMemory(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	url := pgtest.URL(t)
	store := apitest.PostgresStoreAt(t, url)
	f := &fixture{store: store}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var received atomic.Int64
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		received.Add(1)
		w.WriteHeader(http.StatusNoContent)
	}))
	defer recv.Close()
	f.endpoint(t, "busy", recv.URL)
	start := time.Now()
	if _, err := conn.Exec(ctx, `
WITH c AS (
	INSERT INTO charges (id, merchant_id, idempotency_key, order_id, amount_cents, currency, payment_token, status)
	SELECT 'ch_million' || g, 'busy', 'k' || g, g, 100, 'BRL', 'tok_ok', 'captured'
	FROM generate_series(1, $1::int) g
	RETURNING id, merchant_id
)
INSERT INTO webhook_events (id, merchant_id, charge_id, type)
SELECT 'evt_' || substr(id, 4), merchant_id, id, 'charge.captured' FROM c`, millionBacklog); err != nil {
		t.Fatalf("inserting the backlog: %v", err)
	}
	if _, err := conn.Exec(ctx, `ANALYZE webhook_deliveries`); err != nil {
		t.Fatal(err)
	}
	st, err := store.WebhookStats(ctx)
	if err != nil || st.Pending != millionBacklog {
		t.Fatalf("backlog: %+v, %v; want %d pending", st, err, millionBacklog)
	}
	t.Logf("backlog of %d deliveries inserted in %s", millionBacklog, time.Since(start).Round(time.Millisecond))

	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	before := ms.HeapInuse
	s := f.sender(t, webhook.SenderOptions{})
	s.Start(ctx)
	var peak uint64
	const run = 5 * time.Second
	for end := time.Now().Add(run); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		runtime.ReadMemStats(&ms)
		peak = max(peak, ms.HeapInuse)
	}
	s.Stop()
	st, err = store.WebhookStats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("in %s: %d delivered (%.0f/s), %d still pending; heap in use %.1f MB before the sender, %.1f MB at most while it ran (%d goroutines at the end)",
		run, received.Load(), float64(received.Load())/run.Seconds(), st.Pending, float64(before)/(1<<20), float64(peak)/(1<<20), runtime.NumGoroutine())
	if received.Load() == 0 || st.Pending >= millionBacklog {
		t.Fatalf("nothing delivered from the backlog: %d received, %d pending", received.Load(), st.Pending)
	}
	if peak > maxHeapUnderBacklog {
		t.Fatalf("heap in use reached %.1f MB under a backlog of %d, want at most %d MB", float64(peak)/(1<<20), millionBacklog, maxHeapUnderBacklog>>20)
	}
}
