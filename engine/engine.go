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
	"math/rand/v2"
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
	// DefaultMaxInFlight bounds the acquirer calls (with the writes that
	// store their answers) under way at once: a few times a database
	// pool's size, enough to keep the pool busy, small enough that a slow
	// acquirer cannot pile up unbounded work; past it new attempts are
	// shed after AdmissionWait.
	DefaultMaxInFlight = 64
	// DefaultAdmissionWait bounds how long a new attempt waits for one of
	// the MaxInFlight slots before it is shed (503 overloaded). Measured
	// (httpapi's TestAdmissionWaitSizing, numbers in the README's
	// "Overload"): a burst of twice MaxInFlight new charges at once, with
	// the acquirer answering in 50-200 ms, waits at most about 215 ms for
	// a slot, so 500 ms absorbs such bursts with room to spare; when the
	// acquirer stalls (1 s and more), the excess is told within half a
	// second to come back later instead of holding its connection, and a
	// client's timeout, for seconds.
	DefaultAdmissionWait = 500 * time.Millisecond
	// DefaultBackoffBase and DefaultBackoffMax shape the back-off of a
	// record whose acquirer outcome stays unknown (see Backoff); recovery
	// uses the same shape.
	DefaultBackoffBase = time.Second
	DefaultBackoffMax  = 5 * time.Minute
	// OverloadRetryAfter is the Retry-After of a shed attempt: every slot
	// is held by an acquirer call that ends within AcquirerTimeout, and
	// the next one to end frees a slot, usually well within a second. An
	// attempt refused for its merchant's share of the slots is told the
	// same.
	OverloadRetryAfter = time.Second
)

// MerchantSlots is the default of Options.MerchantMaxInFlight for
// maxInFlight slots: all but an eighth of them, which stay out of any one
// merchant's reach (see admission).
func MerchantSlots(maxInFlight int) int {
	return maxInFlight - maxInFlight/8
}

// Reasons an attempt is refused with ERATELIMITED, as RateLimitObserver
// sees them.
const (
	// RateLimitedRate: the merchant is over its own rate.
	RateLimitedRate = "rate"
	// RateLimitedShare: the merchant held its share of the acquirer slots
	// while other merchants needed them, for the whole admission wait.
	RateLimitedShare = "share"
)

// Options configure an Engine. Zero fields take the defaults above.
type Options struct {
	Lease           time.Duration
	AcquirerTimeout time.Duration
	KeyTTL          time.Duration
	WriteTimeout    time.Duration
	WriteRetries    int
	// MaxInFlight bounds the attempts at the acquirer at once. Only an
	// attempt that must call the acquirer takes a slot, after its insert;
	// it waits for one at most AdmissionWait and only while its client is
	// there. Once admitted, an attempt runs to its end whatever the client
	// does.
	MaxInFlight int
	// AdmissionWait bounds how long an attempt that must call the acquirer
	// waits for a slot; past it the attempt is shed (EOVERLOADED) and
	// nothing is kept for its key. Replays, 409s, 422s never wait.
	AdmissionWait time.Duration
	// MerchantMaxInFlight bounds the slots one merchant may hold at once,
	// whoever else is there (default MerchantSlots(MaxInFlight)). While
	// several merchants wait, a freed slot goes to the one holding the
	// fewest; a merchant whose wait ends while it holds this many, or its
	// share of the slots while others want them too, is refused with
	// ERATELIMITED rather than EOVERLOADED: it is its own load that keeps
	// it waiting.
	MerchantMaxInFlight int
	// MerchantRate is the token bucket every merchant's charge attempts go
	// through before anything is written. An attempt without a token that
	// would start work (a new intent) is refused with ERATELIMITED; one
	// answered without starting anything (a replay, 409, 422) is answered
	// all the same, after one read (see overRate). MerchantRates overrides
	// it for some merchants. The zero Rate applies no limit.
	MerchantRate  Rate
	MerchantRates map[string]Rate
	// BackoffBase and BackoffMax shape how long a record whose acquirer
	// outcome is unknown rests before it is driven again, by a client's
	// retry or by recovery: see Backoff.
	BackoffBase time.Duration
	BackoffMax  time.Duration
	Logger      *slog.Logger
	// Observer, when set, is told about every acquirer call (metrics).
	Observer Observer
	// History, when set, is where the engine appends a charge's history
	// off the common path (SPEC "Operators"): recovery's claims, lookups,
	// and captures re-driven or with an unknown outcome. The common path
	// (insert, capture, settle) appends nothing. Nil: the store, if it
	// keeps history.
	History chargeonce.HistoryAppender
	// Settled, when set, is called with the merchant of every record this
	// engine settled (attempts' and recovery's), once its settlement and
	// its event are committed. It must not block (webhook.Sender.Nudge).
	Settled func(merchantID string)
}

// Observer receives the engine's events for metrics. Implementations must
// be safe for concurrent use.
type Observer interface {
	// AcquirerCall is called after every acquirer call.
	AcquirerCall(d time.Duration, err error)
}

// RateLimitObserver, when the Observer also implements it, is told about
// every attempt refused with ERATELIMITED, and why: RateLimitedRate or
// RateLimitedShare.
type RateLimitObserver interface {
	RateLimited(reason string)
}

// AdmissionObserver, when the Observer also implements it, is told how long
// every attempt that needed an acquirer slot waited for one, and whether it
// got one (false: shed, or its client gave up).
type AdmissionObserver interface {
	Admission(wait time.Duration, admitted bool)
}

// Response is what an attempt answers: a status and the exact body bytes.
type Response struct {
	Status int
	Body   []byte
	// Replayed is true when Body is a stored response being repeated.
	Replayed bool
	// RetryAfter, for a 202, is when the record may be driven again: the
	// client's next retry before then gets 202 again without an acquirer
	// call. Transports send it as Retry-After.
	RetryAfter time.Duration
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
	slots    *admission
	rates    *rateLimits
	cache    KeyCache // nil when the store keeps nothing in memory
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
	if opts.AdmissionWait <= 0 {
		opts.AdmissionWait = DefaultAdmissionWait
	}
	if opts.MerchantMaxInFlight <= 0 || opts.MerchantMaxInFlight > opts.MaxInFlight {
		opts.MerchantMaxInFlight = MerchantSlots(opts.MaxInFlight)
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
	if opts.History == nil {
		opts.History, _ = store.(chargeonce.HistoryAppender)
	}
	cache, _ := store.(KeyCache)
	return &Engine{
		store: store, acquirer: acquirer, opts: opts, log: opts.Logger, cache: cache,
		slots: newAdmission(opts.MaxInFlight, opts.MerchantMaxInFlight),
		rates: newRateLimits(opts.MerchantRate, opts.MerchantRates),
	}
}

// KeyCache is what a store that keeps completed records in memory (the
// replay cache) offers besides the store: a look at a completed record that
// costs no database round trip, or false. The engine answers a replay from
// it before anything else, so that the answer a retrying client waits for is
// the cheapest thing the service does: no rate, token, charge id or write
// deadline is spent on it.
type KeyCache interface {
	KeyCached(merchantID, key string) (chargeonce.KeyRecord, bool)
}

// Options returns the engine's effective options.
func (e *Engine) Options() Options { return e.opts }

// Charge runs one attempt of an intent identified by (merchant, key). req
// must already be normalised. It returns the response to send, or an error
// whose code says why there is none: EINPROGRESS (409), EKEYREUSED (422),
// ERATELIMITED (429: the merchant is over its rate or its share of the
// acquirer slots; nothing was kept),
// EOVERLOADED (503: every acquirer slot stayed busy; nothing was kept),
// EUNAVAILABLE (503: the database failed; the record may exist, so the
// client retries with the same key), or an internal error (500).
//
// A replay the replay cache holds is answered first, before the merchant's
// rate: it costs no token, write or acquirer slot (see KeyCache).
// Admission comes after the cheap answers. The insert runs first, with no
// slot: a replay (answered from memory by the replay cache), a 409 or a 422
// needs no acquirer and never queues behind acquirer calls. Only an attempt
// that must call the acquirer (its insert won, or it claims an expired
// lease) takes one of the MaxInFlight slots, waiting at most AdmissionWait;
// a new record that gets no slot is released again, since the acquirer was
// never called. The merchant's rate, checked first, refuses only new work
// too: over it, the cheap answers are still given (see overRate).
func (e *Engine) Charge(ctx context.Context, merchantID, key string, req *chargeonce.ChargeRequest) (Response, error) {
	if err := ctx.Err(); err != nil {
		// The client gave up before the attempt started: nothing written.
		return Response{}, abandoned(err)
	}
	if req.CaptureMethod == chargeonce.CaptureManual {
		if _, ok := e.acquirer.(chargeonce.ManualCapturer); !ok {
			return Response{}, chargeonce.FieldError("capture_method", "this service's acquirer cannot authorize without capturing; capture_method manual is not available (nothing was kept for this Idempotency-Key)")
		}
	}
	fp := idempotency.Fingerprint("POST", "/v1/charges", req)
	if resp, done, err := e.beforeWork(ctx, merchantID, key, fp); done {
		return resp, err
	}
	client := ctx
	token := idempotency.NewToken()
	ctx, cancel := e.detach(ctx)
	defer cancel()
	for round := 1; ; round++ {
		resp, err := e.chargeRound(ctx, client, merchantID, key, fp, token, req)
		if errors.Is(err, errReleased) && round < chargeRounds {
			// The record this attempt found was released before it could
			// be claimed: nothing is kept for the key, so the attempt
			// starts again with an insert.
			continue
		}
		return resp, err
	}
}

// chargeRounds bounds how many times one attempt inserts again after the
// record it found was released (errReleased) before it could claim it.
const chargeRounds = 3

// chargeRound is one round of Charge from its insert: the insert, and then
// the new record's drive or the answer for the one that holds the key.
func (e *Engine) chargeRound(ctx, client context.Context, merchantID, key, fp, token string, req *chargeonce.ChargeRequest) (Response, error) {
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
			Metadata:       req.Metadata,
			CaptureMethod:  req.CaptureMethod,
		},
	})
	if err != nil {
		// The insert may have committed even though we saw an error (a
		// connection lost on COMMIT). Release what our token may own, so a
		// retry starts afresh instead of waiting out a lease. The release
		// can fail too, leaving a committed record that recovery will
		// drive: so the answer never says "nothing happened" (a 500) but
		// that the outcome is unknown and the same key must be retried.
		e.release(ctx, merchantID, key, token)
		return Response{}, fmt.Errorf("%w: beginning charge: %w", chargeonce.Errorf(chargeonce.EUNAVAILABLE,
			"the outcome is unknown; retry with the same Idempotency-Key"), err)
	}
	if inserted {
		// The record is committed. It may call the acquirer only once it
		// holds a slot; without one, nothing has happened yet and the
		// record goes again, so that no ghost turns the retry into a 409.
		done, err := e.admit(client, merchantID)
		if err != nil {
			e.release(ctx, merchantID, key, token)
			return Response{}, err
		}
		defer done()
		// From here on, whatever happens to this process, recovery can
		// finish the charge with the same reference.
		return e.decided(ctx, rec, "", "new key: inserted, admitted, sending to the acquirer", e.driveAttempt(ctx, rec, token, false)), nil
	}

	if resp, done, err := e.answerExisting(ctx, rec, fp, ""); done {
		return resp, err
	}
	return e.takeOver(ctx, client, rec, token)
}

// takeOver answers a retry that found its record processing with the lease
// ended: the attempt that owned the key is gone, or its unknown outcome's
// back-off is over. Rather than answer 409 until recovery gets there, the
// retry claims the record and re-drives it, whatever its kind: it needs a
// slot first (without one the record stays as it is, for a later retry or
// recovery), then looks the reference up and sends it again only if the
// acquirer never settled it.
func (e *Engine) takeOver(ctx, client context.Context, rec chargeonce.KeyRecord, token string) (Response, error) {
	merchantID, key := rec.MerchantID, rec.Key
	done, err := e.admit(client, merchantID)
	if err != nil {
		if code := chargeonce.ErrorCode(err); code == chargeonce.EOVERLOADED || code == chargeonce.ERATELIMITED {
			return Response{Status: 202, Body: pendingBody(&rec), RetryAfter: OverloadRetryAfter}, nil
		}
		return Response{}, err
	}
	defer done()
	claimed, ok, err := e.store.KeyClaim(ctx, merchantID, key, token, e.opts.Lease)
	if chargeonce.ErrorCode(err) == chargeonce.ENOTFOUND {
		// The record is gone since the insert found it: released by the
		// attempt that owned it, which had not called the acquirer (only a
		// charge's record is ever released). It is no 404: the same
		// request with the same key may start again.
		return Response{}, errReleased
	}
	if err != nil {
		return Response{}, fmt.Errorf("claiming expired lease: %w", err)
	}
	if !ok {
		// Somebody else claimed it first; claimed is the record as it is
		// now: its stored answer, or still in progress.
		if claimed.State == chargeonce.KeyCompleted {
			return replay(claimed), nil
		}
		return e.busy(claimed)
	}
	return e.decided(ctx, claimed, "", "lease ended: claimed the record, looking the reference up before any re-send", e.driveAttempt(ctx, claimed, token, true)), nil
}

// errReleased is takeOver's answer when the record it was to claim was
// released meanwhile: nothing is kept for the key and the money never
// moved. Charge inserts again; past chargeRounds the client is told to
// retry (503), as SPEC answers a path that cannot start the attempt now.
var errReleased = &chargeonce.Error{
	Code:       chargeonce.EUNAVAILABLE,
	Message:    "the attempt holding this Idempotency-Key let it go as this one arrived; nothing was kept for it: retry with the same Idempotency-Key",
	RetryAfter: time.Second,
}

// detach returns the context an attempt's writes run on once it starts
// (a charge's or a refund's alike): they run to their end even if the
// client hangs up, since a statement cancelled mid-flight may still commit
// after we gave up on it, leaving a record nobody drives until its lease
// ends; the client's retry will find the finished work instead. The bound
// covers the insert, the admission wait and a claim.
func (e *Engine) detach(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), e.opts.WriteTimeout+e.opts.AdmissionWait+e.opts.AcquirerTimeout)
}

// beforeWork gives an attempt of any kind (a charge, a refund, a capture, a
// cancel) the answers that start no work, before anything is written: one
// rule, so that no kind's retry is refused where another's is answered.
// A completed record in memory (the replay cache) is answered at once,
// rate or not: the stored answer (or a 422 for a different request) moves
// no money, and a rate must never hide a capture or a refund from its
// retry. Then the merchant's rate, before anything is written, so that an
// attempt over it leaves nothing behind: under it (the common path) it
// costs nothing more and done is false, the attempt goes on; over it,
// overRate answers. fp is the attempt's fingerprint.
func (e *Engine) beforeWork(ctx context.Context, merchantID, key, fp string) (resp Response, done bool, err error) {
	if e.cache != nil {
		if rec, ok := e.cache.KeyCached(merchantID, key); ok {
			resp, _, err := e.answerExisting(ctx, rec, fp, "cached: ")
			return resp, true, err
		}
	}
	if ok, wait := e.rates.allow(merchantID); !ok {
		resp, err := e.overRate(ctx, merchantID, key, fp, wait)
		return resp, true, err
	}
	return Response{}, false, nil
}

// overRate answers an attempt its merchant's bucket had no token for. The
// rate bounds the work a merchant can start, not the answers it may hear:
// a replay, a 409 or a 422 starts nothing and is what the attempt would be
// told anyway, and refusing it would only make the client (or a queue
// message) come back for the same answer. So one read decides, from memory
// when the record is completed and cached (replaycache), before anything is
// written: a completed record is replayed (422 for another request), a
// record in flight under a live lease answers as busy does (409, or 202
// for an unknown outcome), and a record whose lease ended answers 202 with
// its pending object (the lease is not claimed over the rate: recovery, or
// a retry under the rate, drives it). The record may be of any kind (keys
// are one namespace per merchant). Only new work (no record, or a
// completed one past its expiry, which a retry would start afresh) is
// refused 429, with nothing written, as is an attempt whose read failed.
func (e *Engine) overRate(ctx context.Context, merchantID, key string, fp string, wait time.Duration) (Response, error) {
	refused := func() (Response, error) {
		e.observeRateLimited(RateLimitedRate)
		return Response{}, &chargeonce.Error{
			Code:       chargeonce.ERATELIMITED,
			Message:    "this merchant is over its rate of attempts; nothing was kept for this Idempotency-Key: retry after the time in Retry-After",
			RetryAfter: wait,
		}
	}
	rctx, cancel := context.WithTimeout(ctx, e.opts.WriteTimeout)
	defer cancel()
	rec, err := e.store.KeyGet(rctx, merchantID, key)
	if err != nil {
		return refused()
	}
	if rec.State == chargeonce.KeyCompleted && !rec.ExpiresAt.IsZero() && rec.ExpiresIn <= 0 {
		return refused()
	}
	if resp, done, err := e.answerExisting(ctx, rec, fp, "over the rate; "); done {
		return resp, err
	}
	e.observeRateLimited(RateLimitedRate)
	return e.decided(ctx, rec, "", "over the rate; lease ended: left for recovery or a retry under the rate",
		Response{Status: 202, Body: pendingBody(&rec), RetryAfter: wait}), nil
}

// answerExisting gives the answers an existing record needs no acquirer
// for: 422 when it guards another request, its stored answer once
// completed, 409 while another attempt holds its lease. done is false for
// a processing record whose lease ended. why prefixes the logged decision.
func (e *Engine) answerExisting(ctx context.Context, rec chargeonce.KeyRecord, fp, why string) (resp Response, done bool, err error) {
	switch {
	case rec.Fingerprint != fp:
		e.decided(ctx, rec, why, "key used for a different request: 422", Response{Status: 422})
		return Response{}, true, chargeonce.Errorf(chargeonce.EKEYREUSED,
			"this Idempotency-Key was already used for a different request; use a new key for a new payment intent")
	case rec.State == chargeonce.KeyCompleted:
		return e.decided(ctx, rec, why, "key completed: replaying the stored answer", replay(rec)), true, nil
	case !rec.LeaseExpired:
		resp, err := e.busy(rec)
		return e.decided(ctx, rec, why, "key in flight under another attempt's lease", resp), true, err
	}
	return Response{}, false, nil
}

// decided logs, at debug level, what the engine decided for an attempt
// (why, then decision: why is a prefix, "" or what brought the attempt
// there) and the status it answers (0: an error, 409 or 422), with the
// key's hash, never the key; it returns resp. Nothing is built when debug
// is off: the two parts are joined only then (joined by every caller, they
// cost every replay an allocation).
func (e *Engine) decided(ctx context.Context, rec chargeonce.KeyRecord, why, decision string, resp Response) Response {
	if e.log.Enabled(ctx, slog.LevelDebug) {
		e.log.LogAttrs(ctx, slog.LevelDebug, "charge attempt",
			slog.String("decision", why+decision),
			slog.String("merchant", rec.MerchantID),
			slog.String("key_hash", idempotency.KeyHash(rec.MerchantID, rec.Key)),
			slog.String(idAttr(&rec), rec.ObjectID()),
			slog.Int("status", resp.Status),
			slog.Int("recovery_attempts", rec.RecoveryAttempts))
	}
	return resp
}

// driveAttempt drives rec as a client's attempt. An unknown outcome backs
// the record off exactly as recovery would (and counts the attempt), so that
// however many retries arrive, the acquirer is called at most once per
// back-off interval; the 202 tells the client when to come back.
//
// lookFirst is for a record somebody else may already have sent to the
// acquirer (a claim of an expired lease): see redrive.
func (e *Engine) driveAttempt(ctx context.Context, rec chargeonce.KeyRecord, token string, lookFirst bool) Response {
	d := e.Backoff(rec.RecoveryAttempts)
	resp := e.run(ctx, rec, token, d, false, lookFirst)
	if resp.Status == 202 {
		resp.RetryAfter = max(resp.RetryAfter, d)
	}
	return resp
}

// busy answers an attempt that found the record processing under a lease
// that has not ended. A record that already had an unknown outcome (and
// rests for its back-off, or is being re-driven) answers 202 with the
// charge, as the attempt that got the unknown outcome did; otherwise the
// first attempt is still at work: 409. Either way Retry-After comes from
// the remaining lease, by the database's clock; a 409 caps it at the
// acquirer timeout, since an attempt at the acquirer answers (or gives up)
// within it, usually long before its lease would end.
func (e *Engine) busy(rec chargeonce.KeyRecord) (Response, error) {
	if rec.RecoveryAttempts > 0 {
		return Response{Status: 202, Body: pendingBody(&rec), RetryAfter: rec.LeaseRemaining}, nil
	}
	err := inProgress()
	err.RetryAfter = min(rec.LeaseRemaining, e.opts.AcquirerTimeout)
	return Response{}, err
}

// admit waits for an acquirer slot for merchant (see admission), at most
// AdmissionWait and as long as the client is there. It returns the function
// that frees the slot, or ERATELIMITED when the merchant's own share of the
// slots kept it waiting, EOVERLOADED when no slot came in time otherwise,
// or EUNAVAILABLE when the client gave up.
func (e *Engine) admit(client context.Context, merchant string) (done func(), err error) {
	free := func() { e.slots.release(merchant) }
	if e.slots.tryAcquire(merchant) {
		e.observeAdmission(0, true)
		return free, nil
	}
	start := time.Now()
	t := time.NewTimer(e.opts.AdmissionWait)
	defer t.Stop()
	ok, why := e.slots.acquire(client, merchant, t.C)
	e.observeAdmission(time.Since(start), ok)
	switch {
	case ok:
		return free, nil
	case why == refusedAbandoned:
		return nil, abandoned(client.Err())
	case why == refusedShare:
		e.observeRateLimited(RateLimitedShare)
		return nil, &chargeonce.Error{
			Code:       chargeonce.ERATELIMITED,
			Message:    fmt.Sprintf("this merchant held its share of the acquirer slots for the whole admission wait (%s), the rest being kept for other merchants; nothing was kept for this Idempotency-Key: retry after the time in Retry-After", e.opts.AdmissionWait),
			RetryAfter: OverloadRetryAfter,
		}
	default:
		return nil, &chargeonce.Error{
			Code:       chargeonce.EOVERLOADED,
			Message:    fmt.Sprintf("every acquirer slot stayed busy for %s; nothing was kept for this Idempotency-Key: retry after the time in Retry-After", e.opts.AdmissionWait),
			RetryAfter: OverloadRetryAfter,
		}
	}
}

func (e *Engine) observeRateLimited(reason string) {
	if o, ok := e.opts.Observer.(RateLimitObserver); ok {
		o.RateLimited(reason)
	}
}

func (e *Engine) observeAdmission(wait time.Duration, admitted bool) {
	if o, ok := e.opts.Observer.(AdmissionObserver); ok {
		o.Admission(wait, admitted)
	}
}

func abandoned(err error) error {
	return chargeonce.Errorf(chargeonce.EUNAVAILABLE, "the request was abandoned before it reached the acquirer: %v", err)
}

// Backoff is how long a record whose acquirer outcome is still unknown after
// attempts failed attempts rests before it is driven again: the engine's
// BackoffBase * 2^attempts, capped at BackoffMax, jittered (see Backoff).
func (e *Engine) Backoff(attempts int) time.Duration {
	return Backoff(attempts, e.opts.BackoffBase, e.opts.BackoffMax)
}

// Backoff is base * 2^attempts, capped at limit, with "equal jitter": a
// random duration between half of that and all of it. Client retries and
// recovery back a record off with this one shape.
//
// Without jitter every instance's recovery loop runs on a fixed period and
// the back-offs are multiples of it, so a record backed off by one instance
// comes due exactly on that instance's next tick: the instance that failed
// to settle a record (its acquirer route or its database writes broken) would
// win it again every time, ahead of healthy instances. Jitter also spreads
// out a backlog that an outage backed off all at once.
func Backoff(attempts int, base, limit time.Duration) time.Duration {
	d := base
	for i := 0; i < attempts && d < limit; i++ {
		d *= 2
	}
	d = min(d, limit)
	if half := d / 2; half > 0 {
		d = half + rand.N(d-half+1) //nolint:gosec // G404: back-off jitter, not a secret; math/rand is the right tool
	}
	return d
}

func inProgress() *chargeonce.Error {
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
			e.log.ErrorContext(ctx, "releasing idempotency key failed", "merchant", merchantID, "err", err)
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

// redrive drives a record somebody else may already have sent to the
// acquirer (recovery, or a retry that took over an expired lease). Real
// acquirers remember a reference only for their idempotency window, after
// which sending it again would capture again; so redrive looks the reference
// up first, settles from the capture the acquirer holds, and sends the
// reference only when the lookup says sending it cannot move money twice
// (chargeonce.LookupSafeToSend).
func (e *Engine) redrive(ctx context.Context, rec chargeonce.KeyRecord, token string, backoff time.Duration, recovering bool) Response {
	return e.run(ctx, rec, token, backoff, recovering, !skipLookupBeforeRedrive)
}

// acquire asks the acquirer for rec's outcome: a lookup first when
// lookFirst, then a capture with the charge's reference unless the lookup
// found one. Both share ctx's deadline (one --acquirer-timeout), so the
// acquirer work of a re-drive ends within its lease just as a first
// attempt's does. A capture the acquirer definitely refused is a decline
// (DeclineAcquirerRejected): nothing moved, and re-sending it would only be
// refused again, forever.
func (e *Engine) acquire(ctx context.Context, rec *chargeonce.KeyRecord, ch *chargeonce.Charge, lookFirst bool, tr *trail) (chargeonce.CaptureResult, error) {
	if lookFirst {
		lr, err := e.acquirer.Lookup(ctx, rec.LookupRequest(chargeonce.LookupToResend))
		tr.lookup(lr, err)
		if found, err := lookedUp(rec, lr, err); found || err != nil {
			return lr.Result, err
		}
	}
	start := time.Now()
	capture := e.acquirer.Capture
	if ch.CaptureMethod == chargeonce.CaptureManual {
		mc, ok := e.acquirer.(chargeonce.ManualCapturer)
		if !ok {
			return chargeonce.CaptureResult{}, errors.New("the acquirer cannot authorize without capturing")
		}
		capture = mc.Authorize
	}
	res, err := capture(ctx, chargeonce.CaptureRequest{
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
	tr.capture(res, err)
	if errors.Is(err, chargeonce.ErrCaptureRejected) {
		e.log.WarnContext(ctx, "the acquirer refused the capture; settling it as declined",
			"charge_id", ch.ID, "merchant", ch.MerchantID, "decline_code", chargeonce.DeclineAcquirerRejected, "err", err)
		return chargeonce.CaptureResult{Reference: ch.Reference(), Status: chargeonce.StatusDeclined, DeclineCode: chargeonce.DeclineAcquirerRejected}, nil
	}
	return res, err
}

// lookedUp reads the answer of the lookup a re-drive makes before sending
// rec's reference again, whatever its kind: found when the acquirer
// settled the reference (the caller takes its result), an error when the
// lookup failed or cannot tell (the reference is not sent), neither when
// sending it is safe.
func lookedUp(rec *chargeonce.KeyRecord, lr chargeonce.LookupResult, err error) (found bool, _ error) {
	if err != nil {
		return false, fmt.Errorf("looking up reference %s: %w", rec.Reference(), err)
	}
	switch lr.Status {
	case chargeonce.LookupFound:
		return true, nil
	case chargeonce.LookupSafeToSend:
		return false, nil
	default:
		return false, &unsureError{reference: rec.Reference(), reason: lr.Reason, retryAfter: lr.RetryAfter, acquirerID: lr.AcquirerID}
	}
}

// RetryAfterError is implemented by an acquirer's error that says how long
// to wait before asking again (Stripe's Retry-After on a 429 or a 503, a
// lookup whose search index lags): the record is not driven again sooner,
// whatever its own back-off, so that recovery never hammers an acquirer
// that asked for quiet. It is found anywhere in the error's chain.
type RetryAfterError interface {
	error
	RetryAfter() time.Duration
}

// unsureError is the error of a re-drive whose lookup could not tell
// whether the acquirer holds a capture for the reference
// (chargeonce.LookupUnsure): the reference is not sent, and the record waits
// at least retryAfter before it is driven again.
type unsureError struct {
	reference  string
	reason     string
	retryAfter time.Duration
	acquirerID string
}

// RetryAfter implements RetryAfterError.
func (e *unsureError) RetryAfter() time.Duration { return e.retryAfter }

// AcquirerID implements chargeonce.AcquirerIDError: the object the lookup
// found still open, which the next lookup retrieves.
func (e *unsureError) AcquirerID() string { return e.acquirerID }

func (e *unsureError) Error() string {
	msg := "looking up reference " + e.reference + ": the acquirer cannot tell yet whether it holds a capture; not sending it"
	if e.reason != "" {
		msg += " (" + e.reason + ")"
	}
	return msg
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
// backoff (for a client's attempt too: see driveAttempt), counting the
// failed attempt, so that a record is driven at most once per back-off
// interval however many retries arrive.
func (e *Engine) run(ctx context.Context, rec chargeonce.KeyRecord, token string, backoff time.Duration, recovering, lookFirst bool) Response {
	if rec.Operation != nil {
		return e.runOperation(ctx, rec, token, backoff, recovering, lookFirst)
	}
	if rec.Refund != nil {
		return e.runRefund(ctx, rec, token, backoff, recovering, lookFirst)
	}
	ch := rec.Charge
	base := context.WithoutCancel(ctx)
	tr := e.startTrail(base, &ch, recovering, lookFirst, rec.RecoveryAttempts)
	actx, cancel := context.WithTimeout(base, e.opts.AcquirerTimeout)
	res, err := e.acquire(actx, &rec, &ch, lookFirst, &tr)
	cancel()
	settled := chargeonce.StatusCaptured // what a success is: an authorization for a manual charge
	if ch.CaptureMethod == chargeonce.CaptureManual {
		settled = chargeonce.StatusAuthorized
	}
	if err == nil && res.Status != settled && res.Status != chargeonce.StatusDeclined {
		err = fmt.Errorf("acquirer answered status %q to a charge whose success is %s", res.Status, settled)
	}
	e.appendHistory(base, &tr, err != nil)
	if err != nil {
		return e.unknown(ctx, &rec, token, backoff, recovering, err)
	}

	final := ch
	final.Status = res.Status
	final.DeclineCode = res.DeclineCode
	resp := FinalResponse(&final)
	return e.settle(ctx, &rec, token, backoff, recovering, resp, chargeonce.KeyCompleteParams{
		ChargeStatus: final.Status,
		DeclineCode:  final.DeclineCode,
	})
}

// unknown answers a drive of rec whose acquirer outcome is unknown (err),
// whatever its kind: the money may or may not have moved. It answers 202
// and hands the record to recovery now rather than after the lease, no
// sooner than backoff or what the acquirer asked for.
func (e *Engine) unknown(ctx context.Context, rec *chargeonce.KeyRecord, token string, backoff time.Duration, recovering bool, err error) Response {
	base := context.WithoutCancel(ctx)
	if ra, ok := errors.AsType[RetryAfterError](err); ok {
		backoff = max(backoff, ra.RetryAfter())
	}
	if ai, ok := errors.AsType[chargeonce.AcquirerIDError](err); ok && ai.AcquirerID() != "" && ai.AcquirerID() != rec.AcquirerID {
		e.recordAcquirerID(base, rec, token, ai.AcquirerID())
	}
	e.log.WarnContext(ctx, "acquirer outcome unknown; record left for recovery",
		idAttr(rec), rec.ObjectID(), "merchant", rec.MerchantID, "recovering", recovering, "err", err)
	e.handOff(base, rec.ObjectID(), rec.MerchantID, rec.Key, token, backoff, recovering)
	return Response{Status: 202, Body: pendingBody(rec), RetryAfter: backoff}
}

// settle stores resp, the final answer of rec's drive by token, with the
// final state in p (whose identity, answer and TTL it fills in), as a
// compare-and-set on token, whatever the record's kind.
func (e *Engine) settle(ctx context.Context, rec *chargeonce.KeyRecord, token string, backoff time.Duration, recovering bool, resp Response, p chargeonce.KeyCompleteParams) Response {
	base := context.WithoutCancel(ctx)
	p.Kind, p.MerchantID, p.Key, p.Token = rec.Kind(), rec.MerchantID, rec.Key, token
	p.ResponseStatus, p.ResponseBody, p.TTL = resp.Status, resp.Body, e.opts.KeyTTL
	err := e.complete(base, p)
	switch {
	case err == nil:
		if e.opts.Settled != nil {
			e.opts.Settled(rec.MerchantID)
		}
		return resp
	case chargeonce.ErrorCode(err) == chargeonce.ESTALE:
		// Another attempt took the record over (our lease ended) and may
		// already have stored the answer; that stored answer is the only
		// one anybody may see.
		rctx, rcancel := context.WithTimeout(base, e.opts.WriteTimeout)
		defer rcancel()
		if cur, gerr := e.store.KeyGet(rctx, rec.MerchantID, rec.Key); gerr == nil && cur.State == chargeonce.KeyCompleted && cur.ObjectID() == rec.ObjectID() {
			return replay(cur)
		}
		return Response{Status: 202, Body: pendingBody(rec)}
	default:
		// The acquirer answered but the answer could not be stored. The
		// record stays processing and recovery re-drives the acquirer with
		// the same reference, which returns the same answer without moving
		// money again. The hand-off is best effort: when the database is
		// still unreachable it fails too, and recovery takes over when the
		// lease ends instead. Recovery's own failures count as attempts, so
		// a write that keeps failing is backed off like an acquirer outage.
		e.log.ErrorContext(ctx, "storing the acquirer's answer failed; record left for recovery",
			idAttr(rec), rec.ObjectID(), "status", resp.Status, "err", err)
		e.handOff(base, rec.ObjectID(), rec.MerchantID, rec.Key, token, backoff, recovering)
		return Response{Status: 202, Body: pendingBody(rec)}
	}
}

// handOff ends token's lease after the back-off d, so that the record is
// driven again (by recovery or a client's retry) no sooner, and counts the
// failed attempt, whether a client's or recovery's: the count decides the
// next back-off, so that retries arriving during an outage cannot drive the
// acquirer more often than recovery would. A lost lease (ESTALE) means
// somebody else already drives the record; other failures leave the lease
// as it was, and recovery takes over when it ends.
func (e *Engine) handOff(base context.Context, chargeID, merchantID, key, token string, d time.Duration, recovering bool) {
	wctx, cancel := context.WithTimeout(base, e.opts.WriteTimeout)
	defer cancel()
	if err := e.store.KeyLeaseSet(wctx, merchantID, key, token, d, true); err != nil && chargeonce.ErrorCode(err) != chargeonce.ESTALE {
		e.log.ErrorContext(base, "handing record to recovery failed; it will be recovered when its lease ends",
			"charge_id", chargeID, "recovering", recovering, "err", err)
	}
}

// recordAcquirerID keeps the acquirer's own id for an unsettled charge, so
// that the next lookup retrieves that object instead of searching for it
// (or, inside the acquirer's key window, re-sending a request whose stored
// answer would only repeat "processing"). Best effort: without it the
// lookup searches, as before.
func (e *Engine) recordAcquirerID(base context.Context, rec *chargeonce.KeyRecord, token, id string) {
	wctx, cancel := context.WithTimeout(base, e.opts.WriteTimeout)
	defer cancel()
	if err := e.store.KeyAcquirerIDSet(wctx, rec.MerchantID, rec.Key, token, id); err != nil && chargeonce.ErrorCode(err) != chargeonce.ESTALE {
		e.log.ErrorContext(base, "recording the acquirer's id failed; the next lookup searches for it",
			idAttr(rec), rec.ObjectID(), "acquirer_id", id, "err", err)
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
