package queue

import (
	"slices"
	"sync"
	"time"

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
	// waits holds, per merchant, the messages the engine could not start
	// yet (see postpone); waiting counts them. They are buffered too, as
	// far as max and snapshot are concerned, but no handler takes them
	// until they are let out.
	waits   map[string]*merchantWait
	waiting int
}

// merchantWait is one merchant's postponed messages, oldest (lowest stream
// sequence) first, and the timer that lets the first of them out.
type merchantWait struct {
	msgs  []postponed
	timer *time.Timer // non-nil while armed
	due   time.Time
	armed uint64 // counts the timers armed; a timer acts only if it is the last
}

type postponed struct {
	seq uint64
	msg jetstream.Msg
}

func newFairQueue(perMerchant, maxBuffered int) *fairQueue {
	q := &fairQueue{
		perMerchant: perMerchant,
		max:         maxBuffered,
		fifos:       map[string][]jetstream.Msg{},
		inFlight:    map[string]int{},
		waits:       map[string]*merchantWait{},
	}
	q.cond = sync.NewCond(&q.mu)
	return q
}

// put buffers msg for merchant, waiting while the buffer is full. It
// reports false, without buffering, once the queue is closed.
func (q *fairQueue) put(merchant string, msg jetstream.Msg) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	for q.buffered+q.waiting >= q.max && !q.closed {
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

// done ends a message taken for merchant. postponed says the handler gave
// it back with postpone. Any other outcome means the engine started (or
// answered) it, so the merchant may have room again: up to two of its
// postponed messages are let out at once, so that a merchant's backlog
// comes back to full speed in a few rounds once its rate or the slots allow,
// while a merchant still over its rate costs at most two refusals per
// answer, not one per message it has waiting.
func (q *fairQueue) done(merchant string, postponed bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.inFlight[merchant]--; q.inFlight[merchant] <= 0 {
		delete(q.inFlight, merchant)
	}
	if !postponed {
		q.letOut(merchant, 2)
	}
	q.cond.Broadcast()
}

// postpone keeps msg, a message of merchant the engine could not start yet
// (429 for the merchant's rate or share, 503 overloaded), for at least d,
// without a redelivery: JetStream counts every redelivery, a nak's
// included, against MaxDeliver, and a delay is not a failed delivery. The
// message waits in the buffer, kept in progress like any message waiting
// its turn, and no handler sleeps on it. A merchant's postponed messages
// come out oldest first, one when the earliest wait ends (a probe: the
// rest would only be refused again) and more as its messages are answered
// (done). It reports false, keeping nothing, once the queue is closed: the
// caller gives the message back.
func (q *fairQueue) postpone(merchant string, seq uint64, msg jetstream.Msg, d time.Duration) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return false
	}
	w := q.waits[merchant]
	if w == nil {
		w = &merchantWait{}
		q.waits[merchant] = w
	}
	i, _ := slices.BinarySearchFunc(w.msgs, seq, func(p postponed, seq uint64) int {
		switch {
		case p.seq < seq:
			return -1
		case p.seq > seq:
			return 1
		}
		return 0
	})
	w.msgs = slices.Insert(w.msgs, i, postponed{seq: seq, msg: msg})
	q.waiting++
	if due := time.Now().Add(d); w.timer == nil || due.Before(w.due) {
		if w.timer != nil {
			w.timer.Stop()
		}
		w.due = due
		w.armed++
		armed := w.armed
		w.timer = time.AfterFunc(d, func() { q.waitEnded(merchant, w, armed) })
	}
	return true
}

// waitEnded lets out the oldest postponed message of merchant when its
// wait ends: w's timer number armed, unless another replaced it since.
func (q *fairQueue) waitEnded(merchant string, w *merchantWait, armed uint64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed || q.waits[merchant] != w || w.armed != armed {
		return
	}
	w.timer = nil
	q.letOut(merchant, 1)
	q.cond.Broadcast()
}

// letOut moves up to n of merchant's postponed messages, oldest first, to
// the front of its FIFO, to be taken next. With the queue closed, they stay
// for drain. q.mu is held.
func (q *fairQueue) letOut(merchant string, n int) {
	w := q.waits[merchant]
	if w == nil || q.closed {
		return
	}
	n = min(n, len(w.msgs))
	out := make([]jetstream.Msg, 0, n+len(q.fifos[merchant]))
	for _, p := range w.msgs[:n] {
		out = append(out, p.msg)
	}
	clear(w.msgs[:n])
	w.msgs = w.msgs[n:]
	q.waiting -= n
	q.buffered += n
	if len(q.fifos[merchant]) == 0 && n > 0 {
		q.ring = append(q.ring, merchant)
	}
	q.fifos[merchant] = append(out, q.fifos[merchant]...)
	if len(w.msgs) == 0 {
		if w.timer != nil {
			w.timer.Stop()
		}
		delete(q.waits, merchant)
	}
}

// snapshot returns the buffered messages, postponed ones included.
func (q *fairQueue) snapshot() []jetstream.Msg {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.all()
}

// all returns every message the queue holds. q.mu is held.
func (q *fairQueue) all() []jetstream.Msg {
	msgs := make([]jetstream.Msg, 0, q.buffered+q.waiting)
	for _, merchant := range q.ring {
		msgs = append(msgs, q.fifos[merchant]...)
	}
	for _, w := range q.waits {
		for _, p := range w.msgs {
			msgs = append(msgs, p.msg)
		}
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

// drain empties the buffer, postponed messages included, and returns what
// it held, for the caller to give back.
func (q *fairQueue) drain() []jetstream.Msg {
	q.mu.Lock()
	defer q.mu.Unlock()
	msgs := q.all()
	for _, w := range q.waits {
		if w.timer != nil {
			w.timer.Stop()
		}
	}
	q.fifos, q.ring, q.next, q.buffered = map[string][]jetstream.Msg{}, nil, 0, 0
	q.waits, q.waiting = map[string]*merchantWait{}, 0
	return msgs
}
