package queue_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

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
