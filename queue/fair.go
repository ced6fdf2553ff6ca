package queue

import (
	"sync"

	"github.com/nats-io/nats.go/jetstream"
)

// fairQueue holds the messages fetched but not yet handled, one FIFO per
// merchant, and hands them to the handlers round-robin among the merchants
// with work and a free slot. So one merchant's backlog cannot hold another
// merchant's request behind it: a request waits for at most one turn per
// merchant with work, not for every message fetched before it.
type fairQueue struct {
	mu   sync.Mutex
	cond *sync.Cond
	// perMerchant caps one merchant's messages in flight while another
	// merchant has messages waiting, so a merchant with a backlog leaves
	// handlers free for the others; a merchant alone uses them all.
	perMerchant int
	// max bounds the buffered messages; put waits beyond it.
	max      int
	fifos    map[string][]jetstream.Msg
	inFlight map[string]int
	// ring lists the merchants with buffered messages, in arrival order;
	// next is where the round-robin resumes.
	ring     []string
	next     int
	buffered int
	closed   bool
}

func newFairQueue(perMerchant, maxBuffered int) *fairQueue {
	q := &fairQueue{
		perMerchant: perMerchant,
		max:         maxBuffered,
		fifos:       map[string][]jetstream.Msg{},
		inFlight:    map[string]int{},
	}
	q.cond = sync.NewCond(&q.mu)
	return q
}

// put buffers msg for merchant, waiting while the buffer is full. It
// reports false, without buffering, once the queue is closed.
func (q *fairQueue) put(merchant string, msg jetstream.Msg) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	for q.buffered >= q.max && !q.closed {
		q.cond.Wait()
	}
	if q.closed {
		return false
	}
	if len(q.fifos[merchant]) == 0 {
		q.ring = append(q.ring, merchant)
	}
	q.fifos[merchant] = append(q.fifos[merchant], msg)
	q.buffered++
	q.cond.Broadcast()
	return true
}

// take waits for the next message of the next merchant in turn that has
// one and is under its in-flight cap, and counts it in flight; the caller
// calls done when it is handled. It reports false once the queue is closed.
func (q *fairQueue) take() (string, jetstream.Msg, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for {
		if q.closed {
			return "", nil, false
		}
		for i := range q.ring {
			idx := (q.next + i) % len(q.ring)
			merchant := q.ring[idx]
			// The cap holds only while another merchant has work
			// waiting: alone, a merchant may use every handler.
			if q.inFlight[merchant] >= q.perMerchant && len(q.ring) > 1 {
				continue
			}
			fifo := q.fifos[merchant]
			msg := fifo[0]
			fifo[0] = nil
			if len(fifo) == 1 {
				delete(q.fifos, merchant)
				q.ring = append(q.ring[:idx], q.ring[idx+1:]...)
				q.next = idx
			} else {
				q.fifos[merchant] = fifo[1:]
				q.next = idx + 1
			}
			if len(q.ring) > 0 {
				q.next %= len(q.ring)
			} else {
				q.next = 0
			}
			q.buffered--
			q.inFlight[merchant]++
			q.cond.Broadcast()
			return merchant, msg, true
		}
		q.cond.Wait()
	}
}

// done ends a message taken for merchant.
func (q *fairQueue) done(merchant string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.inFlight[merchant]--; q.inFlight[merchant] <= 0 {
		delete(q.inFlight, merchant)
	}
	q.cond.Broadcast()
}

// snapshot returns the buffered messages.
func (q *fairQueue) snapshot() []jetstream.Msg {
	q.mu.Lock()
	defer q.mu.Unlock()
	msgs := make([]jetstream.Msg, 0, q.buffered)
	for _, merchant := range q.ring {
		msgs = append(msgs, q.fifos[merchant]...)
	}
	return msgs
}

// close wakes every put and take, which then report false. The buffered
// messages stay until drain.
func (q *fairQueue) close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.closed = true
	q.cond.Broadcast()
}

// drain empties the buffer and returns what it held, for the caller to
// give back.
func (q *fairQueue) drain() []jetstream.Msg {
	q.mu.Lock()
	defer q.mu.Unlock()
	msgs := make([]jetstream.Msg, 0, q.buffered)
	for _, merchant := range q.ring {
		msgs = append(msgs, q.fifos[merchant]...)
	}
	q.fifos, q.ring, q.next, q.buffered = map[string][]jetstream.Msg{}, nil, 0, 0
	return msgs
}
