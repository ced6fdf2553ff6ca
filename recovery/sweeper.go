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
	// OnExpire, when set, is told what every sweep's pass over the
	// expired authorizations did (metrics).
	OnExpire func(ExpiryPass)
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
// charge's own (chargeonce.ExpiryKeyPrefix), so that two sweeps never
// begin two cancels, and recovery finishes one whose outcome is unknown.
type AuthorizationCanceler interface {
	CancelExpired(ctx context.Context, a chargeonce.ExpiredAuthorization) (chargeonce.ExpiryOutcome, error)
}

// ExpiryPass counts what one pass over the expired authorizations did,
// each authorization tried at most once.
type ExpiryPass struct {
	// Canceled were voided at the acquirer by this pass.
	Canceled int
	// Pending were sent, their outcome unknown: recovery settles them.
	Pending int
	// Failed the acquirer refused to void: they stay authorized, for an
	// operator (the store lists them to no later pass).
	Failed int
	// Skipped needed nothing: captured or canceled meanwhile, held by
	// another capture or cancel, or already answered by another sweep.
	Skipped int
	// Errors could not be tried (the store or the engine failed); a later
	// pass lists them again.
	Errors int
}

// Tried is how many authorizations the pass went through.
func (p ExpiryPass) Tried() int { return p.Canceled + p.Pending + p.Failed + p.Skipped + p.Errors }

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
// at a time, and says what it did. The pass is bounded: it goes through
// the list once, in (created_at, id) order, each page after the last one
// seen, so an authorization is tried at most once whatever became of it;
// one whose void the acquirer refused is listed to no later pass either
// (it is an operator's, logged and counted in ExpiryPass.Failed). A cancel
// the store refuses (a capture won the race, the charge is no longer
// authorized) is not an error: the authorization is settled either way.
// Without a Canceler it does nothing.
func (s *Sweeper) ExpireOnce(ctx context.Context) (ExpiryPass, error) {
	var pass ExpiryPass
	if s.opts.Canceler == nil {
		return pass, nil
	}
	p := chargeonce.AuthorizationsExpiredParams{TTL: s.opts.AuthorizationTTL, Limit: s.opts.Batch}
	for {
		due, err := s.store.AuthorizationsExpired(ctx, p)
		if err != nil {
			return pass, err
		}
		for _, a := range due {
			outcome, err := s.opts.Canceler.CancelExpired(ctx, a)
			switch code := chargeonce.ErrorCode(err); {
			case err == nil:
				s.count(&pass, a, outcome)
			case code == chargeonce.ENOTAUTHORIZED || code == chargeonce.ENOTFOUND || code == chargeonce.EINPROGRESS:
				pass.Skipped++
			case errors.Is(err, context.Canceled):
				return pass, err
			default:
				pass.Errors++
				s.log.Error("canceling an expired authorization failed", "charge_id", a.ChargeID, "merchant", a.MerchantID, "err", err)
			}
		}
		if len(due) < s.opts.Batch {
			return pass, nil
		}
		p.After = &due[len(due)-1]
	}
}

// count adds one authorization's outcome to pass, logging those an
// operator must know about.
func (s *Sweeper) count(pass *ExpiryPass, a chargeonce.ExpiredAuthorization, outcome chargeonce.ExpiryOutcome) {
	switch outcome {
	case chargeonce.ExpiryCanceled:
		pass.Canceled++
	case chargeonce.ExpiryPending:
		pass.Pending++
		s.log.Warn("expired authorization's cancel left for recovery", "charge_id", a.ChargeID, "merchant", a.MerchantID)
	case chargeonce.ExpiryFailed:
		pass.Failed++
		s.log.Warn("the acquirer refused to void an expired authorization: it stays authorized for an operator, and the sweeper will not try it again",
			"charge_id", a.ChargeID, "merchant", a.MerchantID)
	default:
		pass.Skipped++
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
	p, err := s.ExpireOnce(ctx)
	if s.opts.OnExpire != nil {
		s.opts.OnExpire(p)
	}
	attrs := []any{"canceled", p.Canceled, "pending", p.Pending, "failed", p.Failed, "skipped", p.Skipped, "errors", p.Errors}
	if err != nil && !errors.Is(err, context.Canceled) {
		s.log.Error("authorization expiry failed", append(attrs, "err", err)...)
	} else if p.Tried() > 0 {
		s.log.Info("expired authorizations swept", attrs...)
	}
}

// Stop ends the loop and waits for the sweep in flight.
func (s *Sweeper) Stop() { s.loop.Stop() }
