// Package engine runs the charge protocol: insert the idempotency record
// first, commit it, call the acquirer, store the final answer with a
// compare-and-set on the attempt's token, and replay that answer to every
// retry. It is the only place that decides what an attempt answers.
package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/idempotency"
)

// Defaults of Options.
const (
	DefaultLease           = 30 * time.Second
	DefaultAcquirerTimeout = 2 * time.Second
	DefaultKeyTTL          = 24 * time.Hour
	// DefaultWriteTimeout bounds each write that must happen even when the
	// client has hung up (storing a response, releasing a key).
	DefaultWriteTimeout = 5 * time.Second
	// DefaultWriteRetries is how many times storing a final response is
	// tried before the record is left for recovery.
	DefaultWriteRetries = 3
	// DefaultMaxInFlight is a few times a database pool's size: enough to
	// keep the pool busy, small enough that a retry storm queues in front
	// of the engine (where abandoned attempts cost nothing) rather than
	// inside it.
	DefaultMaxInFlight = 64
)

// Options configure an Engine. Zero fields take the defaults above.
type Options struct {
	Lease           time.Duration
	AcquirerTimeout time.Duration
	KeyTTL          time.Duration
	WriteTimeout    time.Duration
	WriteRetries    int
	// MaxInFlight bounds the attempts that run at once. An attempt waits
	// for a slot with the client's context, so the attempts of clients that
	// gave up while queued never touch the database; once admitted, an
	// attempt runs to its end whatever the client does.
	MaxInFlight int
	Logger      *slog.Logger
	// Observer, when set, is told about every acquirer call (metrics).
	Observer Observer
}

// Observer receives the engine's events for metrics. Implementations must
// be safe for concurrent use.
type Observer interface {
	// AcquirerCall is called after every acquirer call.
	AcquirerCall(d time.Duration, err error)
}

// Response is what an attempt answers: a status and the exact body bytes.
type Response struct {
	Status int
	Body   []byte
	// Replayed is true when Body is a stored response being repeated.
	Replayed bool
}

// ContentType returns the media type of the body: problem+json for errors.
func (r Response) ContentType() string {
	if r.Status >= 400 {
		return "application/problem+json"
	}
	return "application/json"
}

// Engine runs charges. It is safe for concurrent use; several Engines (one
// per instance) may share one database.
type Engine struct {
	store    chargeonce.Store
	acquirer chargeonce.Acquirer
	opts     Options
	log      *slog.Logger
	slots    chan struct{}
}

// New returns an Engine over store and acquirer.
func New(store chargeonce.Store, acquirer chargeonce.Acquirer, opts Options) *Engine {
	if opts.Lease <= 0 {
		opts.Lease = DefaultLease
	}
	if opts.AcquirerTimeout <= 0 {
		opts.AcquirerTimeout = DefaultAcquirerTimeout
	}
	if opts.KeyTTL <= 0 {
		opts.KeyTTL = DefaultKeyTTL
	}
	if opts.WriteTimeout <= 0 {
		opts.WriteTimeout = DefaultWriteTimeout
	}
	if opts.WriteRetries <= 0 {
		opts.WriteRetries = DefaultWriteRetries
	}
	if opts.MaxInFlight <= 0 {
		opts.MaxInFlight = DefaultMaxInFlight
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	return &Engine{store: store, acquirer: acquirer, opts: opts, log: opts.Logger, slots: make(chan struct{}, opts.MaxInFlight)}
}

// Options returns the engine's effective options.
func (e *Engine) Options() Options { return e.opts }

// Charge runs one attempt of an intent identified by (merchant, key). req
// must already be normalised. It returns the response to send, or an error
// whose code says why there is none: EINPROGRESS (409), EKEYREUSED (422), or
// an internal error (5xx; nothing was charged and the key was released or
// never written).
func (e *Engine) Charge(ctx context.Context, merchantID, key string, req *chargeonce.ChargeRequest) (Response, error) {
	select {
	case e.slots <- struct{}{}:
		defer func() { <-e.slots }()
	case <-ctx.Done():
		// Nothing was written: the client gave up while the attempt was
		// queued, and its retry starts afresh.
		return Response{}, chargeonce.Errorf(chargeonce.EUNAVAILABLE, "the request was abandoned before it started: %v", ctx.Err())
	}
	fp := idempotency.Fingerprint("POST", "/v1/charges", req)
	token := idempotency.NewToken()
	// From here on the attempt runs to its end even if the client hangs up:
	// a statement cancelled mid-flight may still commit after we gave up on
	// it, leaving a record nobody drives until its lease ends. The client's
	// retry will find the finished work instead.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.opts.WriteTimeout+e.opts.AcquirerTimeout)
	defer cancel()
	rec, inserted, err := e.store.KeyInsert(ctx, chargeonce.KeyInsertParams{
		Fingerprint: fp,
		Token:       token,
		Lease:       e.opts.Lease,
		Charge: chargeonce.Charge{
			ID:             idempotency.NewChargeID(),
			MerchantID:     merchantID,
			IdempotencyKey: key,
			OrderID:        req.OrderID,
			AmountCents:    req.AmountCents,
			Currency:       req.Currency,
			PaymentToken:   req.PaymentToken,
			Description:    req.Description,
		},
	})
	if err != nil {
		// The insert may have committed even though we saw an error (a
		// connection lost on COMMIT). Release what our token may own, so a
		// retry starts afresh instead of waiting out a lease.
		e.release(ctx, merchantID, key, token)
		return Response{}, fmt.Errorf("beginning charge: %w", err)
	}
	if inserted {
		// The record is committed: from here on, whatever happens to this
		// process, recovery can finish the charge with the same reference.
		return e.drive(ctx, rec, token, 0, false), nil
	}

	if rec.Fingerprint != fp {
		return Response{}, chargeonce.Errorf(chargeonce.EKEYREUSED,
			"this Idempotency-Key was already used for a different request; use a new key for a new payment intent")
	}
	if rec.State == chargeonce.KeyCompleted {
		return replay(rec), nil
	}
	if !rec.LeaseExpired {
		return Response{}, inProgress()
	}
	// The attempt that owned the key is gone or gave up on an unknown
	// outcome. Rather than answer 409 until recovery gets there, this retry
	// claims the record and re-drives it: it looks the reference up first,
	// and sends it again only if the acquirer never captured it.
	claimed, ok, err := e.store.KeyClaim(ctx, merchantID, key, token, e.opts.Lease)
	if err != nil {
		return Response{}, fmt.Errorf("claiming expired lease: %w", err)
	}
	if !ok {
		// Somebody else claimed it first; claimed is the record as it is
		// now: its stored answer, or still in progress.
		if claimed.State == chargeonce.KeyCompleted {
			return replay(claimed), nil
		}
		return Response{}, inProgress()
	}
	return e.redrive(ctx, claimed, token, 0, false), nil
}

func inProgress() error {
	return chargeonce.Errorf(chargeonce.EINPROGRESS,
		"another attempt with this Idempotency-Key is still processing; retry after the time in Retry-After")
}

// release deletes the record token may own; best effort, detached from the
// client's context.
func (e *Engine) release(ctx context.Context, merchantID, key, token string) {
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.opts.WriteTimeout)
	defer cancel()
	err := e.store.KeyRelease(wctx, merchantID, key, token)
	if err != nil {
		code := chargeonce.ErrorCode(err)
		if code != chargeonce.ESTALE && code != chargeonce.ENOTFOUND {
			e.log.Error("releasing idempotency key failed", "merchant", merchantID, "err", err)
		}
	}
}

func replay(rec chargeonce.KeyRecord) Response {
	return Response{Status: rec.ResponseStatus, Body: rec.ResponseBody, Replayed: true}
}

// Recover drives a record that recovery claimed (rec.Token is recovery's own
// token) to a final answer, looking its reference up before sending it
// again. On an unknown outcome it backs the record off for backoff and
// reports false.
func (e *Engine) Recover(ctx context.Context, rec chargeonce.KeyRecord, backoff time.Duration) (settled bool) {
	resp := e.redrive(ctx, rec, rec.Token, backoff, true)
	return resp.Status != 202
}

// drive calls the acquirer for rec's charge and stores the final answer as
// the attempt owning token. It is for the first attempt, which inserted the
// record and knows the reference was never sent.
func (e *Engine) drive(ctx context.Context, rec chargeonce.KeyRecord, token string, backoff time.Duration, recovering bool) Response {
	return e.run(ctx, rec, token, backoff, recovering, false)
}

// redrive is drive for a record somebody else may already have sent to the
// acquirer (recovery, or a retry that took over an expired lease). Real
// acquirers remember a reference only for their idempotency window, after
// which sending it again would capture again; so redrive looks the reference
// up first, settles from the capture the acquirer holds, and sends the
// reference only when the acquirer definitely has none.
func (e *Engine) redrive(ctx context.Context, rec chargeonce.KeyRecord, token string, backoff time.Duration, recovering bool) Response {
	return e.run(ctx, rec, token, backoff, recovering, true)
}

// acquire asks the acquirer for rec's outcome: a lookup first when
// lookFirst, then a capture with the charge's reference unless the lookup
// found one. Both share ctx's deadline (one --acquirer-timeout), so the
// acquirer work of a re-drive ends within its lease just as a first
// attempt's does. A capture the acquirer definitely refused is a decline
// (DeclineAcquirerRejected): nothing moved, and re-sending it would only be
// refused again, forever.
func (e *Engine) acquire(ctx context.Context, ch *chargeonce.Charge, lookFirst bool) (chargeonce.CaptureResult, error) {
	if lookFirst {
		res, found, err := e.acquirer.Lookup(ctx, ch.Reference())
		if err != nil {
			return chargeonce.CaptureResult{}, fmt.Errorf("looking up reference %s: %w", ch.Reference(), err)
		}
		if found {
			return res, nil
		}
	}
	start := time.Now()
	res, err := e.acquirer.Capture(ctx, chargeonce.CaptureRequest{
		Reference:    ch.Reference(),
		OrderID:      ch.OrderID,
		Merchant:     ch.MerchantID,
		AmountCents:  ch.AmountCents,
		Currency:     ch.Currency,
		PaymentToken: ch.PaymentToken,
	})
	if e.opts.Observer != nil {
		e.opts.Observer.AcquirerCall(time.Since(start), err)
	}
	if errors.Is(err, chargeonce.ErrCaptureRejected) {
		e.log.Warn("the acquirer refused the capture; settling it as declined",
			"charge_id", ch.ID, "merchant", ch.MerchantID, "decline_code", chargeonce.DeclineAcquirerRejected, "err", err)
		return chargeonce.CaptureResult{Reference: ch.Reference(), Status: chargeonce.StatusDeclined, DeclineCode: chargeonce.DeclineAcquirerRejected}, nil
	}
	return res, err
}

// run calls the acquirer for rec's charge (see acquire) and stores the
// final answer as the attempt owning token. The acquirer is called with the
// charge's reference, so driving the same record twice within the
// acquirer's idempotency window can never move money twice, and lookFirst
// covers the time after it.
//
// The acquirer call and the writes after it run on a context detached from
// the client's: a client that hangs up must not leave a charge half-done.
//
// When the record cannot be settled now, it is handed to recovery after
// backoff (zero for a client's attempt: at once rather than when the lease
// ends), counting a recovery attempt when recovering.
func (e *Engine) run(ctx context.Context, rec chargeonce.KeyRecord, token string, backoff time.Duration, recovering, lookFirst bool) Response {
	ch := rec.Charge
	base := context.WithoutCancel(ctx)
	actx, cancel := context.WithTimeout(base, e.opts.AcquirerTimeout)
	res, err := e.acquire(actx, &ch, lookFirst)
	cancel()
	if err == nil && res.Status != chargeonce.StatusCaptured && res.Status != chargeonce.StatusDeclined {
		err = fmt.Errorf("acquirer answered unknown status %q", res.Status)
	}
	if err != nil {
		// Unknown outcome: the money may or may not have moved. Answer 202
		// and hand the record to recovery now rather than after the lease.
		e.log.Warn("acquirer outcome unknown; record left for recovery",
			"charge_id", ch.ID, "merchant", ch.MerchantID, "recovering", recovering, "err", err)
		e.handOff(base, ch.ID, ch.MerchantID, rec.Key, token, backoff, recovering)
		return Response{Status: 202, Body: EncodeCharge(&ch)}
	}

	final := ch
	final.Status = res.Status
	final.DeclineCode = res.DeclineCode
	resp := FinalResponse(&final)
	err = e.complete(base, chargeonce.KeyCompleteParams{
		MerchantID:     ch.MerchantID,
		Key:            rec.Key,
		Token:          token,
		ChargeStatus:   final.Status,
		DeclineCode:    final.DeclineCode,
		ResponseStatus: resp.Status,
		ResponseBody:   resp.Body,
		TTL:            e.opts.KeyTTL,
	})
	switch {
	case err == nil:
		return resp
	case chargeonce.ErrorCode(err) == chargeonce.ESTALE:
		// Another attempt took the record over (our lease ended) and may
		// already have stored the answer; that stored answer is the only
		// one anybody may see.
		rctx, rcancel := context.WithTimeout(base, e.opts.WriteTimeout)
		defer rcancel()
		if cur, gerr := e.store.KeyGet(rctx, ch.MerchantID, rec.Key); gerr == nil && cur.State == chargeonce.KeyCompleted && cur.Charge.ID == ch.ID {
			return replay(cur)
		}
		return Response{Status: 202, Body: EncodeCharge(&ch)}
	default:
		// The acquirer answered but the answer could not be stored. The
		// record stays processing and recovery re-drives the acquirer with
		// the same reference, which returns the same answer without moving
		// money again. The hand-off is best effort: when the database is
		// still unreachable it fails too, and recovery takes over when the
		// lease ends instead. Recovery's own failures count as attempts, so
		// a write that keeps failing is backed off like an acquirer outage.
		e.log.Error("storing the acquirer's answer failed; record left for recovery",
			"charge_id", ch.ID, "status", final.Status, "err", err)
		e.handOff(base, ch.ID, ch.MerchantID, rec.Key, token, backoff, recovering)
		return Response{Status: 202, Body: EncodeCharge(&ch)}
	}
}

// handOff ends token's lease after d, so that recovery may claim the record
// then, and counts a recovery attempt when recovering. A lost lease (ESTALE)
// means somebody else already drives the record; other failures leave the
// lease as it was, and recovery takes over when it ends.
func (e *Engine) handOff(base context.Context, chargeID, merchantID, key, token string, d time.Duration, recovering bool) {
	wctx, cancel := context.WithTimeout(base, e.opts.WriteTimeout)
	defer cancel()
	if err := e.store.KeyLeaseSet(wctx, merchantID, key, token, d, recovering); err != nil && chargeonce.ErrorCode(err) != chargeonce.ESTALE {
		e.log.Error("handing record to recovery failed; it will be recovered when its lease ends",
			"charge_id", chargeID, "err", err)
	}
}

// complete stores the final answer, retrying transient failures.
func (e *Engine) complete(base context.Context, p chargeonce.KeyCompleteParams) error {
	var err error
	for i := 0; i < e.opts.WriteRetries; i++ {
		if i > 0 {
			time.Sleep(time.Duration(i) * 50 * time.Millisecond)
		}
		wctx, cancel := context.WithTimeout(base, e.opts.WriteTimeout)
		err = e.store.KeyComplete(wctx, p)
		cancel()
		if err == nil || chargeonce.ErrorCode(err) == chargeonce.ESTALE {
			return err
		}
	}
	return err
}
