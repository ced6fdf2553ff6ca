package engine

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// mustAcquire fails the test unless acquire for merchant gets a slot within d.
func mustAcquire(t *testing.T, a *admission, merchant string, d time.Duration) {
	t.Helper()
	if a.tryAcquire(merchant) {
		return
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	if ok, why := a.acquire(context.Background(), merchant, tm.C); !ok {
		t.Fatalf("%s got no slot within %s (refusal %d)", merchant, d, why)
	}
}

// acquireAsync starts acquire for merchant with a long wait and reports its
// result on the returned channel.
func acquireAsync(a *admission, merchant string, wait time.Duration) <-chan refusal {
	res := make(chan refusal, 1)
	go func() {
		tm := time.NewTimer(wait)
		defer tm.Stop()
		ok, why := a.acquire(context.Background(), merchant, tm.C)
		if ok {
			why = -1
		}
		res <- why
	}()
	return res
}

func waiting(a *admission) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.waiting
}

func eventuallyWaiting(t *testing.T, a *admission, n int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); waiting(a) != n; {
		if time.Now().After(deadline) {
			t.Fatalf("%d attempts waiting, want %d", waiting(a), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestAdmissionLoneMerchantUsesAllButTheReserve: alone, a merchant takes
// slots up to its ceiling without waiting; the reserve past it goes to a
// merchant that comes later, at once.
func TestAdmissionLoneMerchantUsesAllButTheReserve(t *testing.T) {
	t.Parallel()
	a := newAdmission(64, MerchantSlots(64))
	for i := range 56 {
		if !a.tryAcquire("acme") {
			t.Fatalf("acme's slot %d was not free at once", i+1)
		}
	}
	if a.tryAcquire("acme") {
		t.Fatalf("acme took a 57th slot of 64: nothing is left for another merchant")
	}
	for i := range 8 {
		mustAcquire(t, a, "beta", 10*time.Millisecond)
		_ = i
	}
	if a.used != 64 {
		t.Fatalf("%d slots used, want 64", a.used)
	}
}

// TestAdmissionFreedSlotGoesToFewestHeld: with every slot busy, a freed slot
// goes to the waiting merchant holding the fewest, even when a merchant
// holding more has waited longer.
func TestAdmissionFreedSlotGoesToFewestHeld(t *testing.T) {
	t.Parallel()
	a := newAdmission(4, 4)
	for range 3 {
		mustAcquire(t, a, "acme", time.Millisecond)
	}
	mustAcquire(t, a, "beta", time.Millisecond)
	acme := acquireAsync(a, "acme", 5*time.Second)
	eventuallyWaiting(t, a, 1)
	beta := acquireAsync(a, "beta", 5*time.Second)
	eventuallyWaiting(t, a, 2)
	a.release("acme") // acme 2, beta 1: beta is served
	if why := <-beta; why != -1 {
		t.Fatalf("beta (holding 1) did not get the freed slot: refusal %d", why)
	}
	select {
	case <-acme:
		t.Fatalf("acme (holding 2) got a slot while beta held fewer")
	case <-time.After(20 * time.Millisecond):
	}
	a.release("beta") // acme 2, beta 1, only acme waits: it is served
	if why := <-acme; why != -1 {
		t.Fatalf("acme did not get the slot nobody else wanted: refusal %d", why)
	}
}

// TestAdmissionRoundRobinAmongEquals: merchants holding as many slots are
// served in turn, not in the order their attempts came.
func TestAdmissionRoundRobinAmongEquals(t *testing.T) {
	t.Parallel()
	a := newAdmission(3, 3)
	mustAcquire(t, a, "acme", time.Millisecond)
	mustAcquire(t, a, "beta", time.Millisecond)
	mustAcquire(t, a, "gamma", time.Millisecond)
	var served []string
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, m := range []string{"acme", "acme", "acme", "beta", "beta", "beta"} {
		n := waiting(a)
		wg.Go(func() {
			tm := time.NewTimer(5 * time.Second)
			defer tm.Stop()
			if ok, _ := a.acquire(context.Background(), m, tm.C); ok {
				mu.Lock()
				served = append(served, m)
				mu.Unlock()
			}
		})
		eventuallyWaiting(t, a, n+1)
	}
	// Release one slot at a time, first gamma's, then each time one of
	// whoever was served last, so that acme and beta hold one slot each
	// at every decision.
	last := "gamma"
	for i := range 6 {
		a.release(last)
		for deadline := time.Now().Add(5 * time.Second); ; {
			mu.Lock()
			n := len(served)
			if n == i+1 {
				last = served[i]
			}
			mu.Unlock()
			if n == i+1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("no waiter served after release %d", i+1)
			}
			time.Sleep(time.Millisecond)
		}
	}
	wg.Wait()
	t.Logf("served in order %v", served)
	for i := 1; i < len(served); i++ {
		if served[i] == served[i-1] {
			t.Fatalf("served %v: a merchant got two slots in a row while the other, holding as many, waited", served)
		}
	}
}

// TestAdmissionRefusals: a wait that ends unserved is the merchant's own
// share (it held its ceiling, or its share while others wanted slots) or
// the service being full (it held less).
func TestAdmissionRefusals(t *testing.T) {
	t.Parallel()
	short := 30 * time.Millisecond

	// At its ceiling, alone: its own share keeps it waiting.
	a := newAdmission(8, 7)
	for range 7 {
		mustAcquire(t, a, "acme", time.Millisecond)
	}
	if why := <-acquireAsync(a, "acme", short); why != refusedShare {
		t.Fatalf("acme at its ceiling: refusal %d, want share", why)
	}

	// Two merchants hold every slot, 4 and 4 of 8: a third holding
	// nothing is refused because the service is full; acme, holding more
	// than 8/3, because of its share.
	a = newAdmission(8, 8)
	for range 4 {
		mustAcquire(t, a, "acme", time.Millisecond)
		mustAcquire(t, a, "beta", time.Millisecond)
	}
	gamma := acquireAsync(a, "gamma", short)
	acme := acquireAsync(a, "acme", short)
	if why := <-gamma; why != refusedOverloaded {
		t.Fatalf("gamma holding nothing: refusal %d, want overloaded", why)
	}
	if why := <-acme; why != refusedShare {
		t.Fatalf("acme holding 4 of 8 with two others: refusal %d, want share", why)
	}

	// A client that gives up while waiting leaves nothing behind.
	a = newAdmission(2, 2)
	mustAcquire(t, a, "acme", time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	tm := time.NewTimer(time.Minute)
	defer tm.Stop()
	mustAcquire(t, a, "acme", time.Millisecond)
	if ok, why := a.acquire(ctx, "beta", tm.C); ok || why != refusedAbandoned {
		t.Fatalf("abandoned wait: ok=%v refusal %d, want abandoned", ok, why)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.waiting != 0 || len(a.tenants) != 1 {
		t.Fatalf("after the refusals: %d waiting, %d merchants known; want 0 and 1", a.waiting, len(a.tenants))
	}
}

// TestAdmissionStress: many goroutines of several merchants take and free
// slots at random; no merchant ever holds more than its ceiling, no more
// than the slots are ever held, everybody is served, and the state is empty
// at the end. Run it with -race.
func TestAdmissionStress(t *testing.T) {
	t.Parallel()
	const slots, ceiling, merchants, perMerchant, rounds = 8, 6, 4, 16, 20
	a := newAdmission(slots, ceiling)
	var total atomic.Int32
	held := make([]atomic.Int32, merchants)
	var served, refused atomic.Int32
	var wg sync.WaitGroup
	for m := range merchants {
		id := fmt.Sprintf("m%d", m)
		for range perMerchant {
			wg.Go(func() {
				for range rounds {
					ok := a.tryAcquire(id)
					if !ok {
						tm := time.NewTimer(time.Duration(rand.N(20)) * time.Millisecond)
						ok, _ = a.acquire(context.Background(), id, tm.C)
						tm.Stop()
					}
					if !ok {
						refused.Add(1)
						continue
					}
					served.Add(1)
					if n := held[m].Add(1); n > ceiling {
						t.Errorf("%s holds %d slots, over its ceiling %d", id, n, ceiling)
					}
					if n := total.Add(1); n > slots {
						t.Errorf("%d slots held, over %d", n, slots)
					}
					time.Sleep(time.Duration(rand.N(500)) * time.Microsecond)
					total.Add(-1)
					held[m].Add(-1)
					a.release(id)
				}
			})
		}
	}
	wg.Wait()
	t.Logf("%d attempts served, %d refused", served.Load(), refused.Load())
	if served.Load() == 0 {
		t.Fatalf("nobody was served")
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.used != 0 || a.waiting != 0 || len(a.tenants) != 0 {
		t.Fatalf("at the end: %d used, %d waiting, %d merchants known; want all 0", a.used, a.waiting, len(a.tenants))
	}
}
