package queue

import "testing"

// A merchant alone may use every handler; once another merchant has a
// request waiting, the merchant at its cap is passed over for it.
func TestFairQueueCapHoldsOnlyWhileOthersWait(t *testing.T) {
	t.Parallel()
	q := newFairQueue(1, 100)
	for range 3 {
		q.put("acme", nil)
	}
	for i := range 2 {
		if m, _, ok := q.take(); !ok || m != "acme" {
			t.Fatalf("take %d with acme alone: %q %v; want acme past its cap of 1", i, m, ok)
		}
	}
	q.put("beta", nil)
	if m, _, ok := q.take(); !ok || m != "beta" {
		t.Fatalf("take with beta waiting and acme at its cap: %q %v; want beta", m, ok)
	}
	q.done("acme")
	q.done("acme")
	if m, _, ok := q.take(); !ok || m != "acme" {
		t.Fatalf("take after acme's handlers freed: %q %v; want acme", m, ok)
	}
}
