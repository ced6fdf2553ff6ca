// Package recovery finishes what attempts could not: a Rescuer claims
// processing records whose lease ended (their attempt crashed, or the
// acquirer's outcome was unknown) and re-drives the acquirer with the same
// reference; a Sweeper deletes idempotency records past their expiry.
//
// Both are background services in every serve instance, built as Start/Stop
// around a RunOnce that tests and `chargeonce reconcile` call directly.
package recovery

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/internal/loop"
)

// Defaults of RescuerOptions.
const (
	DefaultEvery       = 5 * time.Second
	DefaultParallelism = 8
	DefaultBackoffBase = engine.DefaultBackoffBase
	DefaultBackoffMax  = engine.DefaultBackoffMax
	// claimTimeout bounds a claim, which Stop does not cut short.
	claimTimeout = 10 * time.Second
)

// RescuerOptions configure a Rescuer. Zero fields take the defaults.
type RescuerOptions struct {
	Every time.Duration
	// Parallelism is how many records a pass drives at once. A record is
	// claimed only when a driver is free to drive it at once, so that no
	// claimed record waits in a queue while its lease runs out: a lease
	// that ends before its record is driven lets another instance claim
	// and send the same reference concurrently.
	Parallelism int
	// BackoffBase and BackoffMax bound how long a record whose acquirer
	// outcome stays unknown waits before its next attempt: base * 2^n,
	// capped at BackoffMax, then jittered down by up to a half.
	BackoffBase time.Duration
	BackoffMax  time.Duration
	Logger      *slog.Logger
	// OnPass, when set, receives what every successful pass did: records
	// claimed, settled and deferred, and the orphan statistics (metrics).
	OnPass func(PassResult)
	// OnFailure, when set, is called with the error of every pass that
	// failed (the database unreachable, typically), so that the stuck
	// metrics keep moving while OnPass cannot be told anything new.
	OnFailure func(error)
}

// Rescuer is the recovery loop.
type Rescuer struct {
	store  chargeonce.Store
	engine *engine.Engine
	opts   RescuerOptions
	log    *slog.Logger

	loop loop.Loop
}

// NewRescuer returns a Rescuer that settles store's orphans through eng.
func NewRescuer(store chargeonce.Store, eng *engine.Engine, opts RescuerOptions) *Rescuer {
	if opts.Every <= 0 {
		opts.Every = DefaultEvery
	}
	if opts.Parallelism <= 0 {
		opts.Parallelism = DefaultParallelism
	}
	if opts.BackoffBase <= 0 {
		opts.BackoffBase = DefaultBackoffBase
	}
	if opts.BackoffMax <= 0 {
		opts.BackoffMax = DefaultBackoffMax
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	return &Rescuer{store: store, engine: eng, opts: opts, log: opts.Logger}
}

// PassResult says what one pass did.
type PassResult struct {
	Claimed  int
	Settled  int
	Deferred int
	Stuck    chargeonce.StuckStats
}

// RunOnce claims every record whose lease has ended and drives each to a
// final answer. Records whose acquirer outcome is still unknown are backed
// off and counted as deferred. A failed pass is reported to OnFailure.
//
// A record is claimed only when one of the Parallelism drivers is free to
// drive it at once: the pass claims as many records as it has free drivers
// (one statement), starts them, and claims more as drivers finish. Its
// lease (longer than the acquirer timeout, which bounds the lookup and the
// capture together) therefore covers the whole of its acquirer call. A pass
// that claimed a whole batch under one lease and drove it a few at a time
// let the leases of the records still queued run out during a slow
// acquirer, and another instance then claimed them and sent the same
// references concurrently.
//
// A pass ends when there is nothing left to claim, or when it claims a
// record it already drove: while the acquirer is down, a record backed off
// early in a long pass can be due again before the pass ends, and without
// that check a large backlog would keep the pass going for as long as the
// outage lasts, never reporting the stuck records it is meant to report.
func (r *Rescuer) RunOnce(ctx context.Context) (PassResult, error) {
	res, err := r.runOnce(ctx)
	if err != nil && r.opts.OnFailure != nil && !errors.Is(err, context.Canceled) {
		r.opts.OnFailure(err)
	}
	return res, err
}

func (r *Rescuer) runOnce(ctx context.Context) (PassResult, error) {
	lease := r.engine.Options().Lease
	type recordKey struct{ merchant, key string }
	var (
		mu   sync.Mutex
		res  PassResult
		wg   sync.WaitGroup
		seen = map[recordKey]bool{}
		free = make(chan struct{}, r.opts.Parallelism) // one token per idle driver
		err  error
	)
	for range r.opts.Parallelism {
		free <- struct{}{}
	}
	for again := false; !again; {
		// Wait for a free driver, then take every other free one.
		select {
		case <-free:
		case <-ctx.Done():
			again = true
			continue
		}
		n := 1
		for more := true; more && n < r.opts.Parallelism; {
			select {
			case <-free:
				n++
			default:
				more = false
			}
		}
		if ctx.Err() != nil {
			for range n {
				free <- struct{}{}
			}
			break
		}
		// The claim runs apart from ctx: a claim cut short by Stop may have
		// committed all the same, and its records would then wait a whole
		// lease, driven by no one. Once claimed, a record is driven (Recover
		// runs to its end whatever ctx does).
		var recs []chargeonce.KeyRecord
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), claimTimeout)
		recs, err = r.store.KeysClaimExpired(cctx, lease, n)
		cancel()
		for range n - len(recs) {
			free <- struct{}{}
		}
		if err != nil || len(recs) == 0 {
			break
		}
		for _, rec := range recs {
			k := recordKey{rec.MerchantID, rec.Key}
			again = again || seen[k]
			seen[k] = true
			// A record claimed a second time is driven too: it is ours
			// now, and leaving it would only delay it by a whole lease.
			wg.Go(func() {
				defer func() { free <- struct{}{} }()
				settled := r.engine.Recover(ctx, rec, r.backoff(rec.RecoveryAttempts))
				mu.Lock()
				defer mu.Unlock()
				if settled {
					res.Settled++
				} else {
					res.Deferred++
				}
			})
		}
		mu.Lock()
		res.Claimed += len(recs)
		mu.Unlock()
	}
	wg.Wait()
	if err != nil {
		return res, err
	}
	stuck, err := r.store.KeysStuck(ctx)
	if err != nil {
		return res, err
	}
	res.Stuck = stuck
	if r.opts.OnPass != nil {
		r.opts.OnPass(res)
	}
	return res, nil
}

// backoff is how long a record recovery could not settle rests before its
// next attempt: engine.Backoff, the one shape client retries and recovery
// share (jittered, so the instance that failed a record does not win it
// again on its next tick), with recovery's own bounds.
func (r *Rescuer) backoff(attempts int) time.Duration {
	return engine.Backoff(attempts, r.opts.BackoffBase, r.opts.BackoffMax)
}

// Start runs passes every opts.Every, the first at once, until Stop. It
// returns at once.
func (r *Rescuer) Start(ctx context.Context) {
	r.loop.Start(ctx, r.opts.Every, true, r.pass)
}

// pass runs one pass and logs what it did.
func (r *Rescuer) pass(ctx context.Context) {
	res, err := r.RunOnce(ctx)
	switch {
	case err != nil && !errors.Is(err, context.Canceled):
		r.log.Error("recovery pass failed", "err", err)
	case res.Claimed > 0:
		r.log.Info("recovery pass", "claimed", res.Claimed, "settled", res.Settled, "deferred", res.Deferred)
	}
	if res.Stuck.Count > 0 {
		r.log.Warn("processing records past their lease", "count", res.Stuck.Count, "oldest_age", res.Stuck.OldestAge.Round(time.Millisecond).String())
	}
}

// Stop ends the loop and waits for the pass in flight.
func (r *Rescuer) Stop() { r.loop.Stop() }
