package recovery

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/internal/loop"
)

// Defaults of SweeperOptions.
const (
	DefaultSweepEvery = time.Minute
	DefaultSweepBatch = 1000
)

// SweeperOptions configure a Sweeper.
type SweeperOptions struct {
	Every  time.Duration
	Batch  int
	Logger *slog.Logger
	// OnSweep, when set, is told how many records every sweep deleted
	// (metrics).
	OnSweep func(deleted int)
}

// Sweeper deletes idempotency records past their expiry (--key-ttl), in
// batches so it never holds long locks. Charges are never deleted.
type Sweeper struct {
	store chargeonce.Store
	opts  SweeperOptions
	log   *slog.Logger

	loop loop.Loop
}

// NewSweeper returns a Sweeper over store.
func NewSweeper(store chargeonce.Store, opts SweeperOptions) *Sweeper {
	if opts.Every <= 0 {
		opts.Every = DefaultSweepEvery
	}
	if opts.Batch <= 0 {
		opts.Batch = DefaultSweepBatch
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	return &Sweeper{store: store, opts: opts, log: opts.Logger}
}

// RunOnce deletes every expired record, a batch at a time, and returns how
// many it deleted.
func (s *Sweeper) RunOnce(ctx context.Context) (int, error) {
	total := 0
	for {
		n, err := s.store.KeysDeleteExpired(ctx, s.opts.Batch)
		total += n
		if err != nil {
			return total, err
		}
		if n < s.opts.Batch {
			return total, nil
		}
	}
}

// Start runs RunOnce every opts.Every until Stop.
func (s *Sweeper) Start(ctx context.Context) {
	s.loop.Start(ctx, s.opts.Every, false, s.sweep)
}

// sweep runs RunOnce and logs what it deleted.
func (s *Sweeper) sweep(ctx context.Context) {
	n, err := s.RunOnce(ctx)
	if s.opts.OnSweep != nil {
		s.opts.OnSweep(n)
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		s.log.Error("key sweep failed", "deleted", n, "err", err)
	} else if n > 0 {
		s.log.Info("expired idempotency keys deleted", "deleted", n)
	}
}

// Stop ends the loop and waits for the sweep in flight.
func (s *Sweeper) Stop() { s.loop.Stop() }
