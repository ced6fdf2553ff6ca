package httpapi_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/internal/apitest"
	"github.com/chargeonce/chargeonce/internal/pgtest"
	"github.com/chargeonce/chargeonce/postgres"
)

// TestChargesThroughPgBouncerUnderLoad serves on loopback with the store
// behind a real PgBouncer in transaction mode and sends 64 concurrent
// clients' charges: no 500 (a pooler's 42P05 or a refused startup
// parameter used to be one); 503s are counted and reported, and the same
// load straight to PostgreSQL is logged beside it.
func TestChargesThroughPgBouncerUnderLoad(t *testing.T) {
	t.Parallel()
	// One after the other, so that the two are measured alike.
	t.Run("pgbouncer", func(t *testing.T) { chargeLoad(t, true) })
	t.Run("direct", func(t *testing.T) { chargeLoad(t, false) })
}

func chargeLoad(t *testing.T, pooled bool) {
	direct := pgtest.URL(t)
	apitest.PostgresStoreAt(t, direct) // migrates over the direct URL
	target := direct
	if pooled {
		target = pgtest.PgBouncer(t, direct)
	}
	store, err := postgres.Open(context.Background(), target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	inst := apitest.Start(t, store, apitest.Simulator(t, acquirer.Options{}), engine.Options{})

	const clients, each = 64, 32
	var mu sync.Mutex
	statuses := map[int]int{}
	var wg sync.WaitGroup
	start := time.Now()
	for c := range clients {
		wg.Go(func() {
			for i := range each {
				r, err := apitest.Do(t, nil, "POST", inst.URL+"/v1/charges",
					[]byte(chargeBody(orderSeq.Add(1), "tok_ok")),
					map[string]string{"Idempotency-Key": fmt.Sprintf("load-%d-%d", c, i)})
				mu.Lock()
				if err != nil {
					statuses[-1]++
				} else {
					statuses[r.Status]++
					if r.Status == 500 && statuses[500] == 1 {
						t.Errorf("500: %s", r.Body)
					}
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	t.Logf("%d charges from %d clients (through PgBouncer: %v) in %v, %.0f/s: statuses %v",
		clients*each, clients, pooled, elapsed.Round(time.Millisecond), float64(clients*each)/elapsed.Seconds(), statuses)
	if statuses[500] > 0 || statuses[-1] > 0 {
		t.Fatalf("%d × 500, %d transport errors", statuses[500], statuses[-1])
	}
	// 503 overloaded and 429 rate-limited shed load when the machine is
	// too slow to serve 64 clients (a share of the acquirer slots or of
	// the body reads waited out): both are answers a client retries, with
	// nothing kept for the key. The test is about the pooler: never a 500.
	if statuses[201]+statuses[402]+statuses[503]+statuses[429] != clients*each {
		t.Fatalf("statuses %v: want only 201, 402, 503 and 429", statuses)
	}
}
