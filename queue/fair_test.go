package queue_test

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/internal/apitest"
	"github.com/chargeonce/chargeonce/queue"
)

// TestFairQueue checks that one merchant's backlog does not hold another
// merchant's request: acme queues 200 slow captures, more than the worker
// gets through in many seconds, then beta sends one fast one, which must be
// answered in about one capture's time, not after acme's backlog.
func TestFairQueue(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const (
		backlog     = 200
		slow        = 300 * time.Millisecond
		concurrency = 4
	)
	sim := apitest.Simulator(t, acquirer.Options{Slow: slow})
	eng := engine.New(e.store, sim, engine.Options{Lease: 30 * time.Second, AcquirerTimeout: 10 * time.Second})
	w := queue.NewWorker(e.js, eng, e.store, queue.WorkerOptions{Concurrency: concurrency})

	// Publish the backlog before the worker starts, so all of it is ahead
	// of beta's request in the stream.
	for i := range backlog {
		m := nats.NewMsg(queue.RequestSubject("acme"))
		m.Header.Set(queue.HeaderIdempotencyKey, fmt.Sprintf("a-%d", i))
		m.Data = []byte(body(int64(1000+i), acquirer.TokenSlow))
		if _, err := e.js.PublishMsg(t.Context(), m); err != nil {
			t.Fatal(err)
		}
	}
	m := nats.NewMsg(queue.RequestSubject("beta"))
	m.Header.Set(queue.HeaderIdempotencyKey, "b-1")
	m.Data = []byte(body(1, "tok_ok"))
	if _, err := e.js.PublishMsg(t.Context(), m); err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	if err := w.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	apitest.Eventually(t, 60*time.Second, "beta's result", func() bool {
		return len(messages(t, e.js, queue.ResultSubject("beta"))) == 1
	})
	waited := time.Since(start)
	fifo := time.Duration(backlog/concurrency) * slow
	t.Logf("beta answered after %s behind %d of acme's %s captures (%s of backlog at concurrency %d)",
		waited.Round(10*time.Millisecond), backlog, slow, fifo, concurrency)
	if waited > 5*time.Second {
		t.Errorf("beta waited %s behind acme's backlog; want < 5s", waited.Round(10*time.Millisecond))
	}
}

// redeliveries counts the deliveries the worker saw redelivered.
type redeliveries struct{ n atomic.Int64 }

func (r *redeliveries) Message(_ string, redelivered bool) {
	if redelivered {
		r.n.Add(1)
	}
}
func (*redeliveries) DeadLetter(string)                  {}
func (*redeliveries) Outbox(chargeonce.OutboxStats, int) {}

// TestFairQueueWaitingNotRedelivered checks that a request waiting its
// merchant's turn longer than AckWait is kept in progress, not redelivered.
func TestFairQueueWaitingNotRedelivered(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const n = 20 // 20 captures of 300 ms one at a time: 6 s, three AckWaits
	sim := apitest.Simulator(t, acquirer.Options{Slow: 300 * time.Millisecond})
	eng := engine.New(e.store, sim, engine.Options{Lease: 30 * time.Second, AcquirerTimeout: time.Second})
	obs := &redeliveries{}
	w := queue.NewWorker(e.js, eng, e.store, queue.WorkerOptions{
		Durable: "fair-wait", AckWait: 2 * time.Second, Concurrency: 2, MerchantConcurrency: 1, Observer: obs,
	})
	keys := make([]string, n)
	for i := range n {
		keys[i] = fmt.Sprintf("w-%d", i)
		m := nats.NewMsg(queue.RequestSubject("acme"))
		m.Header.Set(queue.HeaderIdempotencyKey, keys[i])
		m.Data = []byte(body(int64(2000+i), acquirer.TokenSlow))
		if _, err := e.js.PublishMsg(t.Context(), m); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	apitest.Eventually(t, 30*time.Second, "acme's results", func() bool {
		return len(messages(t, e.js, queue.ResultSubject("acme"))) == n
	})
	if got := obs.n.Load(); got != 0 {
		t.Errorf("%d redeliveries while requests waited their turn; want 0", got)
	}
}

// TestFairQueueStopGivesBack checks that Stop naks the requests still
// waiting, so the next worker takes them at once, not after AckWait.
func TestFairQueueStopGivesBack(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const n = 30
	sim := apitest.Simulator(t, acquirer.Options{Slow: 300 * time.Millisecond})
	eng := engine.New(e.store, sim, engine.Options{Lease: 30 * time.Second, AcquirerTimeout: 10 * time.Second})
	opts := queue.WorkerOptions{Durable: "fair-stop", Concurrency: 2, MerchantConcurrency: 1}
	for i := range n {
		m := nats.NewMsg(queue.RequestSubject("acme"))
		m.Header.Set(queue.HeaderIdempotencyKey, fmt.Sprintf("s-%d", i))
		m.Data = []byte(body(int64(3000+i), acquirer.TokenSlow))
		if _, err := e.js.PublishMsg(t.Context(), m); err != nil {
			t.Fatal(err)
		}
	}
	first := queue.NewWorker(e.js, eng, e.store, opts)
	if err := first.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	apitest.Eventually(t, 10*time.Second, "acme's first result", func() bool {
		return len(messages(t, e.js, queue.ResultSubject("acme"))) > 0
	})
	first.Stop()
	start := time.Now()
	second := queue.NewWorker(e.js, eng, e.store, opts)
	if err := second.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(second.Stop)
	// At one capture at a time the rest takes under 9 s; AckWait is 30 s.
	apitest.Eventually(t, 20*time.Second, "acme's results", func() bool {
		return len(messages(t, e.js, queue.ResultSubject("acme"))) == n
	})
	t.Logf("the second worker answered the rest in %s", time.Since(start).Round(10*time.Millisecond))
}
