package queue_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/queue"
)

// unanswered is a JetStream whose first calls to create a consumer go
// unanswered (the API's timeout), as a cluster electing a leader, or too
// busy to create a replicated consumer in time, leaves them; then it
// answers, or fails every call with fail.
type unanswered struct {
	jetstream.JetStream
	timeouts int32
	fail     error
	calls    atomic.Int32
}

func (u *unanswered) CreateOrUpdateConsumer(ctx context.Context, stream string, cfg jetstream.ConsumerConfig) (jetstream.Consumer, error) {
	if n := u.calls.Add(1); n <= u.timeouts {
		return nil, context.DeadlineExceeded
	}
	if u.fail != nil {
		return nil, u.fail
	}
	return u.JetStream.CreateOrUpdateConsumer(ctx, stream, cfg)
}

func (u *unanswered) CreateOrUpdateStream(ctx context.Context, cfg jetstream.StreamConfig) (jetstream.Stream, error) {
	if n := u.calls.Add(1); n <= u.timeouts {
		return nil, context.DeadlineExceeded
	}
	return u.JetStream.CreateOrUpdateStream(ctx, cfg)
}

// TestWorkerStartAsksAgainWhenJetStreamDoesNotAnswer: a worker whose
// consumer's creation times out asks again until JetStream answers, then
// consumes; an answer that is an error is returned at once. Seen: a
// three-node cluster on a loaded CI machine took longer than the API's 5 s
// to create the R3 consumer, and Start gave up (TestClusterNodeKilled:
// "creating consumer chargeonce-worker on CHARGES: context deadline
// exceeded"). EnsureStreams asks again the same way.
func TestWorkerStartAsksAgainWhenJetStreamDoesNotAnswer(t *testing.T) {
	t.Parallel()
	e := setup(t)
	streams := &unanswered{JetStream: e.js, timeouts: 2}
	if err := queue.EnsureStreams(t.Context(), streams, queue.StreamOptions{}); err != nil {
		t.Fatalf("EnsureStreams after %d unanswered requests: %v", streams.timeouts, err)
	}
	if got := streams.calls.Load(); got != 4 {
		t.Errorf("EnsureStreams asked %d times; want 4 (two unanswered, then each stream once)", got)
	}
	js := &unanswered{JetStream: e.js, timeouts: 3}
	w := queue.NewWorker(js, engine.New(e.store, e.acq.client(), e.opts), e.store, queue.WorkerOptions{})
	if err := w.Start(t.Context()); err != nil {
		t.Fatalf("Start after %d unanswered requests: %v", js.timeouts, err)
	}
	t.Cleanup(w.Stop)
	if got := js.calls.Load(); got != js.timeouts+1 {
		t.Errorf("Start asked %d times; want %d (answered on the last)", got, js.timeouts+1)
	}
	e.send("asked-again", body(1, "tok_ok"), "")
	if r := e.waitResults(20*time.Second, "asked-again")["asked-again"][0]; r.status() != "201" {
		t.Fatalf("the worker's answer: %s %q; want 201", r.status(), r.body)
	}

	refused := &unanswered{JetStream: e.js, timeouts: 1, fail: jetstream.ErrStreamNotFound}
	w2 := queue.NewWorker(refused, engine.New(e.store, e.acq.client(), e.opts), e.store, queue.WorkerOptions{Durable: "refused"})
	if err := w2.Start(t.Context()); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Fatalf("Start when JetStream answers an error: %v; want ErrStreamNotFound", err)
	}
	if got := refused.calls.Load(); got != 2 {
		t.Errorf("Start asked %d times when JetStream answered an error; want 2 (one unanswered, then the error)", got)
	}

	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	never := &unanswered{JetStream: e.js, timeouts: 1 << 30}
	w3 := queue.NewWorker(never, engine.New(e.store, e.acq.client(), e.opts), e.store, queue.WorkerOptions{Durable: "never"})
	if err := w3.Start(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Start when JetStream never answers, until its context ends: %v; want the context's end", err)
	}
}
