package postgres

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// Application-level group commit.
//
// PostgreSQL's cost of a new charge is mostly per statement and per commit
// (executor start-up, the round trip, the WAL flush), not per row. So the
// inserts and the completions of concurrent attempts are coalesced: while a
// batch is running, the attempts that arrive queue up, and when it ends
// they all go together in the next one: their inserts as ONE multi-row
// statement (INSERT ... SELECT FROM unnest(...) ON CONFLICT DO NOTHING),
// their completions as another (UPDATE ... FROM unnest(...) with the token
// compare-and-set per row), both sent in one round trip and committed by
// one transaction (runBatch).
//
// The batching is natural: a batch starts at once when none is running
// (batchesInFlight), so a lone attempt waits for nobody and runs the very
// single-row statement it ran before batching existed; batches only grow
// when the database is already busy.
//
// Each attempt keeps its own outcome: a row the batch inserted (or
// completed) is that attempt's, a row it did not is answered as a single
// statement would answer it. When the batch statement fails as a whole,
// every attempt in it runs its own single statement with its own context,
// so no attempt ever sees an error caused by another.

const (
	// batchesInFlight is how many batches may run at once. One keeps
	// batches as large as the load makes them: measured with `chargeonce
	// bench` at 16 clients (when inserts and completions still had a
	// batcher each), two in flight made batches half as large, cost
	// PostgreSQL 1.4 times the CPU per charge and answered 10% fewer
	// charges.
	batchesInFlight = 1
	// batchMax bounds the attempts in one statement.
	batchMax = 256
	// batchTimeout bounds a batch statement when no attempt in it has a
	// deadline, so that a hung statement cannot hold its slot for ever.
	batchTimeout = 30 * time.Second
)

// job is one attempt waiting in a batcher.
type job interface{ pending() *jobState }

// jobState is what the batcher keeps of every job.
type jobState struct {
	ctx   context.Context
	done  chan struct{}
	taken bool // in a batch (guarded by batcher.mu)
}

func (s *jobState) pending() *jobState { return s }

// batcher coalesces jobs into batches.
type batcher struct {
	// run executes batch (at least two jobs) in one transaction and records
	// each job's outcome in it. An error means the transaction failed as a
	// whole and nothing it recorded counts.
	run func(ctx context.Context, batch []job) error
	// single runs one job alone, with its own context, and records its
	// outcome. retry is set when the job was in a batch whose statement
	// failed: that statement may have committed before the failure was
	// seen (a connection lost on COMMIT).
	single func(j job, retry bool)
	// conflicts keeps two jobs with the same non-empty key out of one
	// batch: the later one waits for the next. "" conflicts with nothing.
	conflicts func(j job) string
	// tracer traces batches (tracing.go); nil when tracing is off.
	tracer trace.Tracer

	// batched counts the batches run (two jobs or more), failed those that
	// failed and fell back to single statements.
	batched, failed atomic.Int64

	mu       sync.Mutex
	queue    []job
	inFlight int
}

// do runs j in a batch and waits for its outcome, or for j's context to
// end. A job still queued when its context ends is taken out and never
// runs; one already in a running batch may still take effect, exactly
// like a single statement cancelled in flight.
func (b *batcher) do(j job) error {
	st := j.pending()
	st.done = make(chan struct{})
	b.mu.Lock()
	b.queue = append(b.queue, j)
	var batch []job
	if b.inFlight < batchesInFlight {
		batch = b.takeLocked()
	}
	b.mu.Unlock()
	if batch != nil {
		b.exec(batch) // this attempt leads: no hand-off to another goroutine
	}
	select {
	case <-st.done:
		return nil
	case <-st.ctx.Done():
		b.mu.Lock()
		if !st.taken {
			for i, q := range b.queue {
				if q == j {
					b.queue = append(b.queue[:i], b.queue[i+1:]...)
					break
				}
			}
			b.mu.Unlock()
			return st.ctx.Err()
		}
		b.mu.Unlock()
		// In a running batch: wait for it. Its statement is bounded by the
		// latest deadline of its jobs, and this job's is among them.
		<-st.done
		return nil
	}
}

// takeLocked takes the next batch off the queue and counts it in flight;
// nil when the queue is empty.
func (b *batcher) takeLocked() []job {
	if len(b.queue) == 0 {
		return nil
	}
	var (
		batch []job
		rest  []job
		seen  = make(map[string]bool, len(b.queue))
	)
	for _, j := range b.queue {
		if len(batch) == batchMax {
			rest = append(rest, j)
			continue
		}
		if k := b.conflicts(j); k != "" {
			if seen[k] {
				rest = append(rest, j)
				continue
			}
			seen[k] = true
		}
		j.pending().taken = true
		batch = append(batch, j)
	}
	b.queue = rest
	b.inFlight++
	return batch
}

// exec runs batch, closes its jobs' done channels, and starts the next
// batch from the queue, if any, on a goroutine of its own.
func (b *batcher) exec(batch []job) {
	if len(batch) == 1 {
		b.single(batch[0], false)
	} else {
		b.batched.Add(1)
		ctx, cancel := batchContext(batch)
		ctx, span := b.startBatchSpan(ctx, batch)
		err := b.run(ctx, batch)
		cancel()
		if span != nil {
			if err != nil {
				// Every job falls back to its own statement, in its own trace.
				span.RecordError(err)
				span.SetStatus(codes.Error, err.Error())
			}
			span.End()
		}
		if err != nil {
			b.failed.Add(1)
			var wg sync.WaitGroup
			for _, j := range batch {
				wg.Go(func() { b.single(j, true) })
			}
			wg.Wait()
		}
	}
	for _, j := range batch {
		close(j.pending().done)
	}
	b.mu.Lock()
	b.inFlight--
	next := b.takeLocked()
	b.mu.Unlock()
	if next != nil {
		go b.exec(next)
	}
}

// batchContext is the context of a batch statement: cancelled by none of
// its jobs (one attempt's cancellation must not fail the others), and
// bounded by the latest of their deadlines, or batchTimeout.
func batchContext(batch []job) (context.Context, context.CancelFunc) {
	var latest time.Time
	for _, j := range batch {
		d, ok := j.pending().ctx.Deadline()
		if !ok {
			latest = time.Time{}
			break
		}
		if d.After(latest) {
			latest = d
		}
	}
	if latest.IsZero() {
		latest = time.Now().Add(batchTimeout)
	}
	return context.WithDeadline(context.WithoutCancel(batch[0].pending().ctx), latest)
}
