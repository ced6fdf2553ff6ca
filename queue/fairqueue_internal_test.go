package queue

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

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
	q.done("acme", false)
	q.done("acme", false)
	if m, _, ok := q.take(); !ok || m != "acme" {
		t.Fatalf("take after acme's handlers freed: %q %v; want acme", m, ok)
	}
}

// fakeMsg is a message the fair queue can hold and tell apart.
type fakeMsg struct {
	jetstream.Msg
	id uint64
}

func takeID(t *testing.T, q *fairQueue) uint64 {
	t.Helper()
	_, m, ok := q.take()
	if !ok {
		t.Fatal("take: the queue is closed")
	}
	return m.(fakeMsg).id
}

// Postponed messages wait out their delay without a handler, then come out
// oldest first: one when the wait ends, two more for every message of the
// merchant answered; snapshot and drain include them, and they count
// towards the buffer's bound.
func TestFairQueuePostpone(t *testing.T) {
	t.Parallel()
	q := newFairQueue(4, 5)
	start := time.Now()
	for _, id := range []uint64{3, 1, 4, 2} {
		if !q.postpone("acme", id, fakeMsg{id: id}, 50*time.Millisecond) {
			t.Fatal("postpone refused on an open queue")
		}
	}
	if n := len(q.snapshot()); n != 4 {
		t.Fatalf("snapshot holds %d messages, want the 4 postponed", n)
	}
	q.put("acme", fakeMsg{id: 9})
	if got := takeID(t, q); got != 9 {
		t.Fatalf("took %d before the wait ended; want 9, the only one not postponed", got)
	}
	if got := takeID(t, q); got != 1 {
		t.Fatalf("after the wait took %d; want 1, the oldest", got)
	}
	if waited := time.Since(start); waited < 50*time.Millisecond {
		t.Fatalf("the postponed message came out after %s; want 50ms", waited)
	}
	// 9 is refused again; 1 is answered, and lets 2 and 3 out.
	q.postpone("acme", 9, fakeMsg{id: 9}, time.Hour)
	q.done("acme", true)
	q.done("acme", false)
	for _, want := range []uint64{2, 3} {
		if got := takeID(t, q); got != want {
			t.Fatalf("took %d, want %d", got, want)
		}
	}
	// 4 and 9 postponed: the bound of 5 holds three more puts.
	for id := range uint64(3) {
		q.put("beta", fakeMsg{id: 100 + id})
	}
	put := make(chan bool)
	go func() { put <- q.put("beta", fakeMsg{id: 200}) }()
	select {
	case <-put:
		t.Fatal("put past the bound with messages postponed")
	case <-time.After(20 * time.Millisecond):
	}
	q.close()
	if ok := <-put; ok {
		t.Fatal("put on a closed queue reported true")
	}
	if q.postpone("acme", 5, fakeMsg{id: 5}, time.Millisecond) {
		t.Fatal("postpone on a closed queue reported true")
	}
	if n := len(q.drain()); n != 5 {
		t.Fatalf("drain returned %d messages, want 5 (3 buffered, 2 postponed)", n)
	}
}
