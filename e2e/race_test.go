package e2e

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/internal/apitest"
	"github.com/chargeonce/chargeonce/internal/pgtest"
)

// TestRaceManyInstancesOneDatabase: three instances on one PostgreSQL
// database, 50 intents x 8 concurrent attempts each spread over them, with
// client timeouts that cut attempts off mid-flight. Every intent must end
// with exactly one capture at the acquirer (none for declines) and every
// attempt's final answer must be byte-identical.
func TestRaceManyInstancesOneDatabase(t *testing.T) {
	t.Parallel()
	const (
		instances = 3
		intents   = 50
		attempts  = 8
	)
	url := pgtest.URL(t)
	sim := apitest.Simulator(t, acquirer.Options{Latency: 100 * time.Millisecond})
	acqSrv := httptest.NewServer(acquirer.Handler(sim))
	t.Cleanup(acqSrv.Close)

	var insts []*apitest.Instance
	for i := 0; i < instances; i++ {
		store := apitest.PostgresStoreAt(t, url) // each instance its own pool
		acq := acquirer.NewClient(acqSrv.URL, &http.Client{})
		insts = append(insts, apitest.Start(t, store, acq, engine.Options{AcquirerTimeout: 2 * time.Second}))
	}

	base := time.Now().UnixNano() % 1e9 * 1000
	type answer struct {
		status int
		body   []byte
	}
	finals := make([][]answer, intents)
	var timeouts, conflicts atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := 0; i < intents; i++ {
		finals[i] = make([]answer, attempts)
		token := "tok_ok"
		if i%5 == 4 {
			token = "tok_declined"
		}
		body := []byte(fmt.Sprintf(`{"order_id": %d, "amount_cents": %d, "payment_token": %q}`, base+int64(i), 1000+i, token))
		key := fmt.Sprintf("race-%d", i)
		for a := 0; a < attempts; a++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				rng := rand.New(rand.NewPCG(uint64(i), uint64(a)))
				deadline := time.Now().Add(90 * time.Second)
				var last string
				for n := 0; time.Now().Before(deadline); n++ {
					inst := insts[(a+n)%instances]
					// Client timeouts between 20ms and 500ms against a 100ms
					// acquirer: many attempts give up mid-flight. Like a
					// real client, each retry is a little more patient, so
					// the test also ends on a loaded machine.
					timeout := time.Duration(20+rng.IntN(481)+100*n) * time.Millisecond
					c := &http.Client{Timeout: min(timeout, 5*time.Second)}
					got := charge(c, inst.URL, key, body)
					st, b := got.status, got.body
					switch {
					case got.err != nil:
						last = got.err.Error()
						timeouts.Add(1)
					case st == 201 || st == 402:
						finals[i][a] = answer{st, b}
						return
					case st == 409:
						last = "409"
						conflicts.Add(1)
					case st == 202:
						last = "202"
					default:
						t.Errorf("intent %d attempt %d: unexpected %d %s", i, a, st, b)
						return
					}
					time.Sleep(time.Duration(10+rng.IntN(40)) * time.Millisecond)
				}
				t.Errorf("intent %d attempt %d: no final answer in 90s; last: %s", i, a, last)
			}()
		}
	}
	close(start)
	wg.Wait()
	if t.Failed() {
		return
	}

	approved := 0
	for i := 0; i < intents; i++ {
		order := base + int64(i)
		for a := 1; a < attempts; a++ {
			if finals[i][a].status != finals[i][0].status || !bytes.Equal(finals[i][a].body, finals[i][0].body) {
				t.Errorf("intent %d: attempt %d answered %d %s, attempt 0 answered %d %s",
					i, a, finals[i][a].status, finals[i][a].body, finals[i][0].status, finals[i][0].body)
			}
		}
		want := 0
		if i%5 != 4 {
			want = 1
			approved++
			if finals[i][0].status != 201 {
				t.Errorf("intent %d: final status %d, want 201", i, finals[i][0].status)
			}
		} else if finals[i][0].status != 402 {
			t.Errorf("intent %d: final status %d, want 402", i, finals[i][0].status)
		}
		if got := sim.CapturedCount("demo", order); got != want {
			t.Errorf("intent %d: acquirer captured %d times, want %d", i, got, want)
		}
		charges, err := insts[0].Store.ChargesListByOrder(context.Background(), "demo", order)
		if err != nil || len(charges) != 1 {
			t.Errorf("intent %d: %d charges stored (%v), want 1", i, len(charges), err)
		}
	}
	st := sim.Stats()
	t.Logf("%d intents x %d attempts over %d instances: %d client timeouts, %d 409s; acquirer: %d requests, %d captures (%d approved intents), %d duplicate requests",
		intents, attempts, instances, timeouts.Load(), conflicts.Load(), st.CaptureRequests, st.Captures, approved, st.DuplicateRequests)
	if st.Captures != int64(approved) {
		t.Fatalf("acquirer moved money %d times for %d approved intents", st.Captures, approved)
	}
	if timeouts.Load() == 0 {
		t.Fatalf("no attempt timed out: the test did not exercise client timeouts")
	}
	// The instances are wired as serve wires them: replays went through
	// each instance's replay cache, and some were answered from memory.
	var hits int64
	for _, inst := range insts {
		hits += inst.Replays.Stats().Hits
	}
	t.Logf("replay caches answered %d replays from memory", hits)
	if hits == 0 {
		t.Fatalf("no replay was answered by a replay cache: the instances are not wired as serve wires them")
	}
}
