package engine

import (
	"context"
	"sync"
	"time"
)

// admission hands out the acquirer slots (Options.MaxInFlight) among
// merchants so that none can starve another.
//
// It is work-conserving: a free slot never idles while an attempt that may
// take it waits, and a merchant alone may use every slot but the reserve.
// The reserve (MaxInFlight - MerchantMaxInFlight slots) exists because a
// slot is held for as long as an acquirer call takes, up to
// --acquirer-timeout, far longer than --admission-wait: a merchant arriving
// while another holds every slot with slow charges could not wait for one
// to free up, so a few slots stay out of any single merchant's reach.
//
// When attempts wait, a freed slot goes to the waiting merchant holding the
// fewest slots, and among merchants holding as many, to the one served
// longest ago (round robin); a merchant's own attempts are served in the
// order they came. So a merchant holding its fair share or more does not
// get the next free slot while a merchant holding less waits for it.
type admission struct {
	slots   int // MaxInFlight
	perCap  int // MerchantMaxInFlight: the most one merchant may hold
	mu      sync.Mutex
	used    int
	stamp   uint64
	tenants map[string]*tenant // merchants holding or waiting for a slot
	waiting int                // attempts waiting, over all merchants
}

// tenant is one merchant's part of the admission state.
type tenant struct {
	id       string
	held     int
	queue    []*waiter
	servedAt uint64 // admission.stamp when it was last given a slot
}

// waiter is one attempt waiting for a slot. granted is set, and ready
// closed, under admission.mu.
type waiter struct {
	ready   chan struct{}
	granted bool
}

func newAdmission(slots, perMerchant int) *admission {
	return &admission{slots: slots, perCap: perMerchant, tenants: map[string]*tenant{}}
}

// refusal says why an attempt's wait ended without a slot.
type refusal int

const (
	// refusedOverloaded: every slot stayed busy and the merchant held less
	// than its share of them.
	refusedOverloaded refusal = iota
	// refusedShare: the merchant held its share of the slots (or its
	// ceiling, MerchantMaxInFlight) while others needed them.
	refusedShare
	// refusedAbandoned: ctx ended first.
	refusedAbandoned
)

// tryAcquire gives merchant a slot at once if one may be its now: a slot is
// free, the merchant is under its ceiling and nobody waits (a waiter would
// be served first). On success it returns true and the slot is held.
func (a *admission) tryAcquire(merchant string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.used >= a.slots || a.waiting > 0 {
		return false
	}
	t := a.tenant(merchant)
	if t.held >= a.perCap {
		return false
	}
	a.grant(t)
	return true
}

// acquire waits for a slot for merchant until timeout fires or ctx is done.
// It returns ok when the slot is held; otherwise why not.
func (a *admission) acquire(ctx context.Context, merchant string, timeout <-chan time.Time) (ok bool, why refusal) {
	a.mu.Lock()
	t := a.tenant(merchant)
	w := &waiter{ready: make(chan struct{})}
	t.queue = append(t.queue, w)
	a.waiting++
	a.dispatch()
	a.mu.Unlock()

	select {
	case <-w.ready:
		return true, 0
	case <-timeout:
		why = refusedOverloaded
	case <-ctx.Done():
		why = refusedAbandoned
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if w.granted {
		// Given a slot in the moment the wait ended: keep it.
		return true, 0
	}
	for i, q := range t.queue {
		if q == w {
			t.queue = append(t.queue[:i], t.queue[i+1:]...)
			break
		}
	}
	a.waiting--
	if why == refusedOverloaded && a.overShare(t) {
		why = refusedShare
	}
	a.forget(t)
	// Leaving may let another waiter through (it was behind this one in
	// its merchant's queue, or a share computed with this one counted).
	a.dispatch()
	return false, why
}

// release frees one slot merchant holds and hands it on.
func (a *admission) release(merchant string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	t := a.tenants[merchant]
	t.held--
	a.used--
	a.forget(t)
	a.dispatch()
}

// overShare reports whether t holds its ceiling (short of every slot), or,
// while other merchants want slots too, at least an equal share of them:
// its wait ended because of what it holds, not because the service was
// full.
func (a *admission) overShare(t *tenant) bool {
	if t.held >= a.perCap && a.perCap < a.slots {
		return true
	}
	n := len(a.tenants)
	if n <= 1 {
		return false
	}
	return t.held >= max(1, a.slots/n)
}

// dispatch gives free slots to waiters: each to the first waiter of the
// merchant that holds the fewest slots (the least recently served among
// equals) and is under its ceiling.
func (a *admission) dispatch() {
	for a.used < a.slots && a.waiting > 0 {
		var next *tenant
		for _, t := range a.tenants {
			if len(t.queue) == 0 || t.held >= a.perCap {
				continue
			}
			if next == nil || t.held < next.held || (t.held == next.held && t.servedAt < next.servedAt) {
				next = t
			}
		}
		if next == nil {
			return
		}
		w := next.queue[0]
		next.queue[0] = nil
		next.queue = next.queue[1:]
		a.waiting--
		w.granted = true
		close(w.ready)
		a.grant(next)
	}
}

func (a *admission) grant(t *tenant) {
	a.used++
	a.stamp++
	t.held++
	t.servedAt = a.stamp
}

func (a *admission) tenant(merchant string) *tenant {
	t, ok := a.tenants[merchant]
	if !ok {
		t = &tenant{id: merchant}
		a.tenants[merchant] = t
	}
	return t
}

// forget drops t once it neither holds nor waits, so that only merchants
// with demand count towards shares.
func (a *admission) forget(t *tenant) {
	if t.held == 0 && len(t.queue) == 0 {
		delete(a.tenants, t.id)
	}
}
