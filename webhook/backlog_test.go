package webhook_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/internal/apitest"
	"github.com/chargeonce/chargeonce/internal/pgtest"
	"github.com/chargeonce/chargeonce/webhook"
)

// backlogSize is the hostile merchant's backlog in TestBacklogDoesNotDelayOthers.
const backlogSize = 400_000

var attackerEndpointsN = chargeonce.MaxWebhookEndpoints

// TestBacklogDoesNotDelayOthers: one merchant has 400,000 deliveries due to
// an endpoint that never answers (the backlog 27,017 redeliveries once
// built); another merchant's deliveries still arrive promptly. Each of
// the victim's settlements is timed from its commit to its arrival at the
// receiver: the p99 stays under 100 ms, the sender polling every 20 ms.
// Before the claim walked endpoints, every claim scanned past the backlog
// (275-330 ms each, seen as 1.2-2.9 s of delivery latency).
func TestBacklogDoesNotDelayOthers(t *testing.T) {
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

	release := make(chan struct{})
	hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer hang.Close()
	defer close(release) // runs before hang.Close, so its handlers return

	var (
		mu      sync.Mutex
		arrived = map[string]time.Time{}
	)
	fast := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		if _, ok := arrived[r.Header.Get("webhook-id")]; !ok {
			arrived[r.Header.Get("webhook-id")] = time.Now()
		}
		mu.Unlock()
	}))
	defer fast.Close()

	// The attacker has the most endpoints a merchant may have, all
	// hanging; the backlog is spread across them as the redeliveries that
	// built it spread it (432,288 deliveries for 27,017 calls: 16 each).
	var attackerEndpoints []string
	for range attackerEndpointsN {
		attackerEndpoints = append(attackerEndpoints, f.endpoint(t, "attacker", hang.URL).ID)
	}
	f.endpoint(t, "victim", fast.URL)

	// The backlog in one statement: charges settled (as the engine leaves
	// them), their events, and (by the fan-out trigger) one delivery each.
	start := time.Now()
	tag, err := conn.Exec(ctx, `
WITH c AS (
	INSERT INTO charges (id, merchant_id, idempotency_key, order_id, amount_cents, currency, payment_token, status)
	SELECT 'ch_backlog' || g, 'attacker', 'k' || g, g, 100, 'BRL', 'tok_ok', 'captured'
	FROM generate_series(1, $1::int / $2::int) g
	RETURNING id, merchant_id
)
INSERT INTO webhook_events (id, merchant_id, charge_id, type)
SELECT 'evt_' || substr(id, 4), merchant_id, id, 'charge.captured' FROM c`, backlogSize, len(attackerEndpoints))
	if err != nil {
		t.Fatalf("inserting the backlog: %v", err)
	}
	var pending int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM webhook_deliveries WHERE state = 'pending' AND merchant_id = 'attacker'`).
		Scan(&pending); err != nil || pending != backlogSize {
		t.Fatalf("backlog: %d events, %d pending deliveries, %v; want %d", tag.RowsAffected(), pending, err, backlogSize)
	}
	if _, err := conn.Exec(ctx, `ANALYZE webhook_deliveries`); err != nil {
		t.Fatal(err)
	}
	// The backlog's writes are flushed before the victim's latency is
	// measured: on a small machine the checkpoint they would otherwise set
	// off makes every commit wait on the disk for seconds, whatever the
	// claim costs.
	if _, err := conn.Exec(ctx, `CHECKPOINT`); err != nil {
		t.Logf("CHECKPOINT refused (%v): the latencies may include the backlog's writes", err)
	}
	t.Logf("backlog of %d deliveries inserted in %s", backlogSize, time.Since(start).Round(time.Millisecond))

	ts := &timedStore{Store: store}
	f.store = ts
	s := f.sender(t, webhook.SenderOptions{})
	s.Start(ctx)
	defer s.Stop()

	// The attacker's deliveries are under way (and hang) before the
	// victim's settle.
	apitest.Eventually(t, 10*time.Second, "the attacker's deliveries claimed", func() bool {
		var n int
		_ = conn.QueryRow(ctx, `SELECT count(*) FROM webhook_deliveries WHERE merchant_id = 'attacker' AND claimed_until > now()`).Scan(&n)
		return n >= webhook.DefaultPerMerchant
	})

	// One round: the victim settles 100 charges, 20 ms apart, each timed
	// from its commit to its arrival at the receiver.
	const settlements = 100
	round := func() []time.Duration {
		settled := map[string]time.Time{}
		for range settlements {
			ch := f.settle(t, "victim", chargeonce.StatusCaptured)
			settled["evt_"+ch.ID[3:]] = time.Now()
			time.Sleep(20 * time.Millisecond)
		}
		apitest.Eventually(t, 30*time.Second, "every victim delivery arrived", func() bool {
			mu.Lock()
			defer mu.Unlock()
			for id := range settled {
				if _, ok := arrived[id]; !ok {
					return false
				}
			}
			return true
		})
		mu.Lock()
		defer mu.Unlock()
		var lat []time.Duration
		for id, at := range settled {
			lat = append(lat, arrived[id].Sub(at))
		}
		slices.Sort(lat)
		return lat
	}
	// A round over the bound is measured again, at most three rounds in
	// all: a loaded machine's stall (the whole suite under -race beside
	// it) passes, a claim that scans past the backlog is in every round.
	const rounds = 3
	for r := 1; ; r++ {
		lat := round()
		ts.mu.Lock()
		claims := slices.Clone(ts.claims)
		ts.mu.Unlock()
		slices.Sort(claims)
		t.Logf("round %d: %d claims so far: p50 %s, p99 %s", r, len(claims), claims[len(claims)/2], claims[len(claims)*99/100])
		p50, p99 := lat[len(lat)/2], lat[len(lat)*99/100-1]
		t.Logf("round %d: victim delivery latency behind %d pending deliveries: p50 %s, p99 %s, max %s", r, backlogSize, p50, p99, lat[len(lat)-1])
		if p99 < 100*time.Millisecond {
			return
		}
		if r == rounds {
			t.Fatalf("victim delivery p99 = %s behind another merchant's backlog of %d in each of %d rounds, want < 100 ms (p50 %s)", p99, backlogSize, rounds, p50)
		}
	}
}

type timedStore struct {
	chargeonce.Store
	mu     sync.Mutex
	claims []time.Duration
}

func (s *timedStore) WebhookDeliveriesClaim(ctx context.Context, lease time.Duration, limit, perMerchant int, skip []string) ([]chargeonce.WebhookDelivery, error) {
	start := time.Now()
	ds, err := s.Store.WebhookDeliveriesClaim(ctx, lease, limit, perMerchant, skip)
	s.mu.Lock()
	s.claims = append(s.claims, time.Since(start))
	s.mu.Unlock()
	return ds, err
}
