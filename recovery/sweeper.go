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
	// Canceler, when set, cancels authorizations older than
	// AuthorizationTTL on every sweep (the engine's CancelExpired): at the
	// acquirer, with the charge protocol, recording charge.canceled.
	Canceler AuthorizationCanceler
	// AuthorizationTTL is how long an authorization waits for its capture
	// (--authorization-ttl); chargeonce.DefaultAuthorizationTTL when zero.
	AuthorizationTTL time.Duration
}

// AuthorizationCanceler cancels an expired authorization (implemented by
// *engine.Engine): the cancel's record is inserted first under a key of the
// charge's own, so that two sweeps never begin two cancels, and recovery
// finishes one whose outcome is unknown.
type AuthorizationCanceler interface {
	CancelExpired(ctx context.Context, a chargeonce.ExpiredAuthorization) (settled bool, err error)
}

// Sweeper deletes idempotency records past their expiry (--key-ttl), in
// batches so it never holds long locks, and cancels authorizations past
// theirs (--authorization-ttl). Charges are never deleted.
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
	if opts.AuthorizationTTL <= 0 {
		opts.AuthorizationTTL = chargeonce.DefaultAuthorizationTTL
	}
	return &Sweeper{store: store, opts: opts, log: opts.Logger}
}

// ExpireOnce cancels the authorizations past opts.AuthorizationTTL, a batch
// at a time, and returns how many cancels it began (settled or left to
// recovery). A cancel the store refuses (a capture won the race, the
// charge is no longer authorized) is not an error: the authorization is
// settled either way. Without a Canceler it does nothing.
func (s *Sweeper) ExpireOnce(ctx context.Context) (int, error) {
	if s.opts.Canceler == nil {
		return 0, nil
	}
	total := 0
	for {
		due, err := s.store.AuthorizationsExpired(ctx, s.opts.AuthorizationTTL, s.opts.Batch)
		if err != nil {
			return total, err
		}
		began := 0
		for _, a := range due {
			settled, err := s.opts.Canceler.CancelExpired(ctx, a)
			switch code := chargeonce.ErrorCode(err); {
			case err == nil:
				began++
				if !settled {
					s.log.Warn("expired authorization's cancel left for recovery", "charge_id", a.ChargeID, "merchant", a.MerchantID)
				}
			case code == chargeonce.ENOTAUTHORIZED || code == chargeonce.ENOTFOUND:
			case errors.Is(err, context.Canceled):
				return total + began, err
			default:
				s.log.Error("canceling an expired authorization failed", "charge_id", a.ChargeID, "merchant", a.MerchantID, "err", err)
			}
		}
		total += began
		// A batch that began nothing (every cancel refused or failing)
		// would be listed again: stop until the next sweep.
		if len(due) < s.opts.Batch || began == 0 {
			return total, nil
		}
	}
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
	c, err := s.ExpireOnce(ctx)
	if err != nil && !errors.Is(err, context.Canceled) {
		s.log.Error("authorization expiry failed", "canceled", c, "err", err)
	} else if c > 0 {
		s.log.Info("expired authorizations canceled", "canceled", c)
	}
}

// Stop ends the loop and waits for the sweep in flight.
func (s *Sweeper) Stop() { s.loop.Stop() }
