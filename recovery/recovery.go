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
	"math/rand/v2"
	"sync"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/engine"
)

// Defaults of RescuerOptions.
const (
	DefaultEvery       = 5 * time.Second
	DefaultBatch       = 100
	DefaultParallelism = 8
	DefaultBackoffBase = time.Second
	DefaultBackoffMax  = 5 * time.Minute
)

// RescuerOptions configure a Rescuer. Zero fields take the defaults.
type RescuerOptions struct {
	Every       time.Duration
	Batch       int
	Parallelism int
	// BackoffBase and BackoffMax bound how long a record whose acquirer
	// outcome stays unknown waits before its next attempt: base * 2^n,
	// capped at BackoffMax, then jittered down by up to a half.
	BackoffBase time.Duration
	BackoffMax  time.Duration
	Logger      *slog.Logger
	// OnStuck, when set, receives the orphan statistics after every pass.
	OnStuck func(chargeonce.StuckStats)
}

// Rescuer is the recovery loop.
type Rescuer struct {
	store  chargeonce.Store
	engine *engine.Engine
	opts   RescuerOptions
	log    *slog.Logger

	loop loop
}

// NewRescuer returns a Rescuer that settles store's orphans through eng.
func NewRescuer(store chargeonce.Store, eng *engine.Engine, opts RescuerOptions) *Rescuer {
	if opts.Every <= 0 {
		opts.Every = DefaultEvery
	}
	if opts.Batch <= 0 {
		opts.Batch = DefaultBatch
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

// RunOnce claims every record whose lease has ended (in batches) and drives
// each to a final answer. Records whose acquirer outcome is still unknown
// are backed off and counted as deferred.
//
// A pass ends when a batch comes back short, or when it holds a record this
// pass already drove: while the acquirer is down, a record backed off early
// in a long pass can be due again before the pass ends, and without that
// check a backlog larger than a batch would keep the pass going for as long
// as the outage lasts, never reporting the stuck records it is meant to
// report.
func (r *Rescuer) RunOnce(ctx context.Context) (PassResult, error) {
	var res PassResult
	lease := r.engine.Options().Lease
	type recordKey struct{ merchant, key string }
	seen := map[recordKey]bool{}
	for {
		recs, err := r.store.KeysClaimExpired(ctx, lease, r.opts.Batch)
		if err != nil {
			return res, err
		}
		again := false
		for _, rec := range recs {
			k := recordKey{rec.MerchantID, rec.Key}
			again = again || seen[k]
			seen[k] = true
		}
		res.Claimed += len(recs)
		// Records claimed a second time are driven too: they are ours now,
		// and leaving them would only delay them by a whole lease.
		settled := r.drive(ctx, recs)
		res.Settled += settled
		res.Deferred += len(recs) - settled
		if len(recs) < r.opts.Batch || again || ctx.Err() != nil {
			break
		}
	}
	stuck, err := r.store.KeysStuck(ctx)
	if err != nil {
		return res, err
	}
	res.Stuck = stuck
	if r.opts.OnStuck != nil {
		r.opts.OnStuck(stuck)
	}
	return res, nil
}

func (r *Rescuer) drive(ctx context.Context, recs []chargeonce.KeyRecord) int {
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		settled int
		sem     = make(chan struct{}, r.opts.Parallelism)
	)
	for _, rec := range recs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			ok := r.engine.Recover(ctx, rec, r.backoff(rec.RecoveryAttempts))
			if ok {
				mu.Lock()
				settled++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return settled
}

// backoff is base * 2^attempts, capped at max, with "equal jitter": a
// random duration between half of that and all of it.
//
// Without jitter every instance's recovery loop runs on a fixed period and
// the back-offs are multiples of it, so a record backed off by one instance
// comes due exactly on that instance's next tick: the instance that failed
// to settle a record (its acquirer route or its database writes broken) would
// win it again every time, ahead of healthy instances. Jitter also spreads
// out a backlog that an outage backed off all at once.
func (r *Rescuer) backoff(attempts int) time.Duration {
	d := r.opts.BackoffBase
	for i := 0; i < attempts && d < r.opts.BackoffMax; i++ {
		d *= 2
	}
	d = min(d, r.opts.BackoffMax)
	if half := d / 2; half > 0 {
		d = half + rand.N(d-half+1)
	}
	return d
}

// Start runs passes every opts.Every, the first at once, until Stop. It
// returns at once.
func (r *Rescuer) Start(ctx context.Context) {
	r.loop.start(ctx, r.opts.Every, true, r.pass)
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
func (r *Rescuer) Stop() { r.loop.stop() }
