package recovery_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/internal/apitest"
	"github.com/chargeonce/chargeonce/internal/pgtest"
	"github.com/chargeonce/chargeonce/recovery"
)

// overlapAcquirer records, per reference, whether a capture request began
// while another request for the same reference was still in flight: the
// same reference sent concurrently by two drivers.
type overlapAcquirer struct {
	chargeonce.Acquirer
	mu       sync.Mutex
	inFlight map[string]int
	overlaps map[string]int
	calls    atomic.Int64
}

func (a *overlapAcquirer) Capture(ctx context.Context, req chargeonce.CaptureRequest) (chargeonce.CaptureResult, error) {
	a.calls.Add(1)
	a.mu.Lock()
	if a.inFlight[req.Reference] > 0 {
		a.overlaps[req.Reference]++
	}
	a.inFlight[req.Reference]++
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		a.inFlight[req.Reference]--
		a.mu.Unlock()
	}()
	return a.Acquirer.Capture(ctx, req)
}

// TestRecoveryNeverSendsAReferenceTwiceAtOnce is issue 9's fifth case: two
// instances recover one backlog from one database while the acquirer is
// slow. A pass used to claim a hundred records under one lease and drive
// eight at a time, so the leases of the records still queued ran out and
// the other instance claimed and sent them too, while the first was still
// about to send (or sending) them. Recovery claims only what it drives at
// once, so every lease covers its own acquirer call.
func TestRecoveryNeverSendsAReferenceTwiceAtOnce(t *testing.T) {
	t.Parallel()
	const orphans = 48
	url := pgtest.URL(t)
	sim := apitest.Simulator(t, acquirer.Options{Latency: 300 * time.Millisecond})
	acq := &overlapAcquirer{Acquirer: sim, inFlight: map[string]int{}, overlaps: map[string]int{}}
	opts := engine.Options{Lease: time.Second, AcquirerTimeout: 900 * time.Millisecond}
	var rescuers []*recovery.Rescuer
	var first chargeonce.Store
	for i := range 2 {
		s := apitest.PostgresStoreAt(t, url)
		if i == 0 {
			first = s
		}
		rescuers = append(rescuers, recovery.NewRescuer(s, engine.New(s, acq, opts), recovery.RescuerOptions{}))
	}
	for i := range orphans {
		orphan(t, first, fmt.Sprintf("slow-%03d", i), request("tok_ok"))
	}

	// Both instances run passes back to back until the backlog is gone.
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for _, r := range rescuers {
		wg.Go(func() {
			for ctx.Err() == nil {
				if _, err := r.RunOnce(ctx); err != nil && ctx.Err() == nil {
					t.Errorf("RunOnce: %v", err)
					return
				}
				st, err := first.KeysStuck(ctx)
				if err == nil && st.Count == 0 && processingLeft(t, first, orphans) == 0 {
					return
				}
			}
		})
	}
	wg.Wait()
	if ctx.Err() != nil {
		t.Fatalf("the backlog was not settled within 60s")
	}
	acq.mu.Lock()
	defer acq.mu.Unlock()
	t.Logf("%d orphans, %d capture requests, %d references sent concurrently", orphans, acq.calls.Load(), len(acq.overlaps))
	for ref, n := range acq.overlaps {
		t.Errorf("reference %s was sent while a request for it was in flight (%d times)", ref, n)
	}
	if st := sim.Stats(); st.Captures != orphans {
		t.Errorf("acquirer stats %+v, want %d captures", st, orphans)
	}
}

// processingLeft counts the records still processing.
func processingLeft(t *testing.T, s chargeonce.Store, orphans int) int {
	t.Helper()
	n := 0
	for i := range orphans {
		rec, err := s.KeyGet(t.Context(), "demo", fmt.Sprintf("slow-%03d", i))
		if err == nil && rec.State == chargeonce.KeyProcessing {
			n++
		}
	}
	return n
}
