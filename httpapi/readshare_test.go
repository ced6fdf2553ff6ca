package httpapi_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/httpapi"
	"github.com/chargeonce/chargeonce/internal/apitest"
	"github.com/chargeonce/chargeonce/internal/pgtest"
)

// TestReadsShareFairly reproduces issue 34's item 8: one merchant reading
// in 64 loops held the database pool, and another merchant's charges
// waited behind it (p50 8 ms → 1.06 s). With per-merchant read shares the
// other merchant's p50 stays near its p50 without the flood; the same
// flood with the shares lifted shows the harm.
func TestReadsShareFairly(t *testing.T) {
	t.Parallel()
	p50 := func(shares int, flood bool) (time.Duration, map[int]int) {
		store := apitest.PostgresStoreAt(t, pgtest.URL(t))
		keys, err := httpapi.ParseKeys("reader:sk_reader,buyer:sk_buyer")
		if err != nil {
			t.Fatal(err)
		}
		eng := engine.New(store, apitest.Simulator(t, acquirer.Options{}), engine.Options{})
		srv := httptest.NewServer(httpapi.New(httpapi.Config{Engine: eng, Store: store, Keys: keys, MaxReadsPerMerchant: shares}))
		defer srv.Close()
		// Something to read.
		for i := range 20 {
			r, err := apitest.Do(t, nil, "POST", srv.URL+"/v1/charges", fmt.Appendf(nil, `{"order_id":%d,"amount_cents":100,"payment_token":"tok_ok"}`, i+1),
				map[string]string{"Authorization": "Bearer sk_reader", "Idempotency-Key": fmt.Sprintf("seed-%d", i)})
			if err != nil || r.Status != 201 {
				t.Fatalf("seeding: %d %v", r.Status, err)
			}
		}
		stop := make(chan struct{})
		var wg sync.WaitGroup
		var mu sync.Mutex
		reads := map[int]int{}
		var n atomic.Int64
		if flood {
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
			for range 64 {
				wg.Go(func() {
					for {
						select {
						case <-stop:
							return
						default:
						}
						r, err := apitest.Do(t, client, "GET", srv.URL+"/v1/charges?limit=100", nil, map[string]string{"Authorization": "Bearer sk_reader"})
						if err != nil {
							continue
						}
						mu.Lock()
						reads[r.Status]++
						mu.Unlock()
						n.Add(1)
					}
				})
			}
			time.Sleep(500 * time.Millisecond)
		}
		var took []time.Duration
		for i := range 30 {
			start := time.Now()
			r, err := apitest.Do(t, nil, "POST", srv.URL+"/v1/charges", fmt.Appendf(nil, `{"order_id":%d,"amount_cents":100,"payment_token":"tok_ok"}`, i+1),
				map[string]string{"Authorization": "Bearer sk_buyer", "Idempotency-Key": fmt.Sprintf("buy-%d", i)})
			if err != nil || r.Status != 201 {
				t.Fatalf("buyer's charge: %d %s %v", r.Status, r.Body, err)
			}
			took = append(took, time.Since(start))
		}
		close(stop)
		wg.Wait()
		slices.Sort(took)
		return took[len(took)/2], reads
	}
	// The machine is shared (and -race slows everything): either the
	// buyer is near its p50 alone, or the shares at least halve the harm.
	// The three measurements are taken again, up to three times, when a
	// run misses that: under the whole suite's load one run can (seen: a
	// p50 of 99 ms with shares against 182 ms without, 4 ms alone); shares
	// that never help miss it every time.
	for try := 1; ; try++ {
		alone, _ := p50(0, false)
		unshared, readsUnshared := p50(1<<20, true)
		shared, readsShared := p50(0, true)
		t.Logf("buyer's charge p50: alone %s; with reader's 64 loops and no read shares %s (reads %v); with shares of %d %s (reads %v)",
			alone.Round(time.Microsecond), unshared.Round(time.Microsecond), readsUnshared, httpapi.DefaultMaxReadsPerMerchant, shared.Round(time.Microsecond), readsShared)
		if readsShared[200] == 0 {
			t.Fatalf("the reader was served nothing: %v", readsShared)
		}
		if shared <= 4*alone+50*time.Millisecond || shared <= unshared/2 {
			return
		}
		if try == 3 {
			t.Fatalf("with read shares the buyer's p50 is %s against %s alone and %s without shares, in 3 runs of 3", shared, alone, unshared)
		}
	}
}
