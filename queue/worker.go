package queue

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/idempotency"
	"github.com/chargeonce/chargeonce/wire"
)

// Defaults of WorkerOptions.
const (
	DefaultDurable = "chargeonce-worker"
	// DefaultAckWait must exceed what one message can take: a wait for an
	// engine slot plus the engine's write and acquirer timeouts plus the
	// result's publish. A message not acked in time is redelivered, which
	// is harmless (it replays) but wasteful.
	DefaultAckWait = 30 * time.Second
	// DefaultMaxDeliver bounds the deliveries of a request that keeps
	// failing. With the NakWithDelay back-off below (1 s doubling to 30 s)
	// the last delivery comes about 7.5 minutes after the first. A request
	// waiting out its merchant's rate or an overload is not redelivered
	// (see fairQueue.postpone), so waiting spends none of them.
	DefaultMaxDeliver    = 20
	DefaultMaxAckPending = 1000
	DefaultConcurrency   = 32
	// DefaultMerchantConcurrency (zero) caps one merchant's messages in
	// flight at half of Concurrency (at least one), so a merchant with a
	// backlog always leaves handlers free for the others.
	DefaultMerchantConcurrency = 0
	// DefaultNakDelayMax caps the back-off of a redelivered request.
	DefaultNakDelayMax = 30 * time.Second
	// DefaultWriteTimeout bounds the database and JetStream calls made after
	// the engine answered.
	DefaultWriteTimeout = 10 * time.Second
)

// pullExpiry is how long one pull request of the worker lasts.
const pullExpiry = 5 * time.Second

// minPostpone is the shortest wait of a postponed request, so that a
// Retry-After rounded down to nothing cannot spin a handler.
const minPostpone = 10 * time.Millisecond

// Message outcomes, as Observer sees them.
const (
	OutcomeAnswered   = "answered"    // a final answer published (200/201/402)
	OutcomeReplayed   = "replayed"    // a stored answer published again
	OutcomeOutbox     = "outbox"      // unknown outcome: the outbox will publish it
	OutcomeInProgress = "in_progress" // 409: redelivered later
	OutcomeRejected   = "rejected"    // 422: the key was used for another request
	OutcomePoison     = "poison"      // 400/413: dead-lettered and terminated
	OutcomeError      = "error"       // a database or JetStream failure: redelivered later
	OutcomeGaveUp     = "gave_up"     // MaxDeliver reached while still failing: a 503 result, dead-lettered
	// OutcomeRefused: a refund, capture or cancel the store refused with
	// nothing written (its charge not found; not captured, or not enough
	// left to refund; not authorized, or less authorized than the capture
	// asks): a 4xx result for this message, acked.
	OutcomeRefused = "refused"
	// OutcomeDelayed: the engine could not start it yet (429 for the
	// merchant's rate or share, 503 overloaded); the worker keeps it and
	// tries again after its Retry-After, without a redelivery.
	OutcomeDelayed = "delayed"
)

// Observer receives the worker's and the publisher's events for metrics.
// Implementations must be safe for concurrent use.
type Observer interface {
	// Message is called once per delivery with its outcome.
	Message(outcome string, redelivered bool)
	// DeadLetter is called for every request copied to charges.dead.
	DeadLetter(reason string)
	// Outbox is called with the outbox's state after every publisher pass.
	Outbox(st chargeonce.OutboxStats, published int)
}

// WorkerOptions configure a Worker. Zero fields take the defaults.
type WorkerOptions struct {
	Durable       string
	AckWait       time.Duration
	MaxDeliver    int
	MaxAckPending int
	// Concurrency is how many messages the worker handles at once.
	Concurrency int
	// MerchantConcurrency is how many of one merchant's messages the worker
	// handles at once; zero is half of Concurrency (at least one), more than
	// Concurrency is Concurrency.
	MerchantConcurrency int
	NakDelayMax         time.Duration
	WriteTimeout        time.Duration
	Logger              *slog.Logger
	Observer            Observer
	// TracerProvider, when set, traces every message: a consumer span
	// continuing the trace its headers carry (trace.go), with the engine's
	// spans beneath it. Nil: no spans, and nothing read from the headers.
	TracerProvider trace.TracerProvider
}

// Worker consumes charge requests with a durable pull consumer and answers
// each through the engine. Several workers (in several processes) share one
// durable consumer and one database.
type Worker struct {
	js     jetstream.JetStream
	engine *engine.Engine
	store  chargeonce.Store
	opts   WorkerOptions
	log    *slog.Logger
	tracer trace.Tracer // nil: tracing off

	mu      sync.Mutex
	cc      jetstream.ConsumeContext
	queue   *fairQueue
	wg      sync.WaitGroup
	stop    context.CancelFunc
	refresh context.CancelFunc
}

// NewWorker returns a worker that runs requests through eng and uses store
// (the engine's store, or the one beneath its cache) for the outbox flag and
// for reading settled answers.
func NewWorker(js jetstream.JetStream, eng *engine.Engine, store chargeonce.Store, opts WorkerOptions) *Worker {
	if opts.Durable == "" {
		opts.Durable = DefaultDurable
	}
	if opts.AckWait <= 0 {
		opts.AckWait = DefaultAckWait
	}
	if opts.MaxDeliver <= 0 {
		opts.MaxDeliver = DefaultMaxDeliver
	}
	if opts.MaxAckPending <= 0 {
		opts.MaxAckPending = DefaultMaxAckPending
	}
	if opts.Concurrency <= 0 {
		opts.Concurrency = DefaultConcurrency
	}
	if opts.MerchantConcurrency <= 0 {
		opts.MerchantConcurrency = max(1, opts.Concurrency/2)
	}
	opts.MerchantConcurrency = min(opts.MerchantConcurrency, opts.Concurrency)
	if opts.NakDelayMax <= 0 {
		opts.NakDelayMax = DefaultNakDelayMax
	}
	if opts.WriteTimeout <= 0 {
		opts.WriteTimeout = DefaultWriteTimeout
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	w := &Worker{js: js, engine: eng, store: store, opts: opts, log: opts.Logger}
	if opts.TracerProvider != nil {
		w.tracer = opts.TracerProvider.Tracer(tracerScope)
	}
	return w
}

// ConsumerConfig is the durable consumer every worker shares.
//
// Its MaxDeliver is twice the worker's. The worker gives a request up
// itself at its MaxDeliver-th failing delivery, and answers it then (see
// giveUp); JetStream, at its own MaxDeliver, would drop the request with
// nothing but an advisory, unanswered. The second half is room for what
// can keep the worker from finishing that last delivery (the results
// stream unreachable as it gives up, a request given back at shutdown, a
// crash), so that JetStream is never the one to give up first.
func (w *Worker) ConsumerConfig() jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:       w.opts.Durable,
		Description:   "chargeonce workers",
		FilterSubject: RequestSubjectPrefix + "*",
		DeliverPolicy: jetstream.DeliverAllPolicy,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       w.opts.AckWait,
		MaxDeliver:    2 * w.opts.MaxDeliver,
		MaxAckPending: w.opts.MaxAckPending,
	}
}

// createConsumer creates or updates the consumer, asking again while the
// JetStream API does not answer in time (untilAnswered). Seen: a three-node
// cluster on a loaded CI machine took longer than the API's 5 s to create
// the R3 consumer (TestClusterNodeKilled), and the worker gave up.
func (w *Worker) createConsumer(ctx context.Context) (jetstream.Consumer, error) {
	return untilAnswered(ctx, func() (jetstream.Consumer, error) {
		return w.js.CreateOrUpdateConsumer(ctx, RequestStream, w.ConsumerConfig())
	}, func(attempt int, err error) {
		w.log.WarnContext(ctx, "JetStream did not answer in time creating the consumer; asking again",
			"consumer", w.opts.Durable, "stream", RequestStream, "attempt", attempt, "err", err)
	})
}

// Start creates (or updates) the durable consumer and starts consuming. The
// streams must exist (EnsureStreams). It returns once consuming has begun,
// or when ctx ends; a JetStream API that does not answer in time (a cluster
// electing a leader, or too busy to create a replicated consumer within the
// API timeout) is asked again until it does (untilAnswered).
func (w *Worker) Start(ctx context.Context) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.cc != nil {
		return nil
	}
	cons, err := w.createConsumer(ctx)
	if err != nil {
		return fmt.Errorf("creating consumer %s on %s: %w", w.opts.Durable, RequestStream, err)
	}
	hctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	rctx, stopRefresh := context.WithCancel(context.WithoutCancel(ctx))
	w.stop, w.refresh = cancel, stopRefresh
	// The server delivers at most MaxAckPending unacked messages to the
	// durable (to all its workers together), which bounds the buffer too;
	// the explicit bound only holds if someone raised it on the server.
	q := newFairQueue(w.opts.MerchantConcurrency, w.opts.MaxAckPending)
	w.queue = q
	for range w.opts.Concurrency {
		w.wg.Go(func() {
			for {
				merchant, msg, ok := q.take()
				if !ok {
					return
				}
				wait, delayed := w.run(hctx, msg)
				if delayed && !q.postpone(merchant, streamSeq(msg), msg, wait) {
					// Stopping: back to JetStream, for after its wait.
					w.settle(msg, func() error { return msg.NakWithDelay(wait) }, streamSeq(msg))
				}
				q.done(merchant, delayed)
			}
		})
	}
	w.wg.Go(func() { w.keepBuffered(rctx, q) })
	// The callback runs on one goroutine and only buffers: the fair queue,
	// not the stream's order, decides which merchant goes next, so the
	// client keeps fetching past one merchant's backlog to the others'.
	w.cc, err = cons.Consume(func(msg jetstream.Msg) {
		merchant, _ := merchantOf(msg.Subject())
		// Stopping: the message is left unacked (redelivered after
		// AckWait). A nak now would hand it straight back to this very
		// consumer, again and again, each time counting a delivery.
		_ = q.put(merchant, msg)
	},
		// One large pull, not many small ones: with a callback that never
		// blocks, small pulls sometimes stall until their expiry (the
		// client misses heartbeats and re-pulls). The short expiry bounds
		// such a stall.
		jetstream.PullMaxMessages(w.opts.MaxAckPending),
		jetstream.PullExpiry(pullExpiry),
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			if !errors.Is(err, nats.ErrConnectionClosed) {
				w.log.Warn("consuming charge requests", "err", err)
			}
		}))
	if err != nil {
		q.close()
		stopRefresh()
		w.wg.Wait()
		cancel()
		return fmt.Errorf("consuming %s: %w", RequestStream, err)
	}
	return nil
}

// keepBuffered tells JetStream the buffered messages are still being worked
// on, a few times per AckWait, so a message waiting its merchant's turn is
// not redelivered (to this or another worker) while it waits.
func (w *Worker) keepBuffered(ctx context.Context, q *fairQueue) {
	tick := time.NewTicker(w.opts.AckWait / 4)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		for _, msg := range q.snapshot() {
			// A message taken (even acked) since the snapshot makes this
			// fail or do nothing, which is harmless.
			_ = msg.InProgress()
		}
	}
}

// Stop stops fetching, gives the buffered messages back to JetStream (nak:
// they are redelivered at once, to another worker if one runs), lets the
// messages in flight finish (their acks and results included) and returns.
func (w *Worker) Stop() {
	w.mu.Lock()
	cc := w.cc
	w.cc = nil
	w.mu.Unlock()
	if cc == nil {
		return
	}
	// Close first: a callback waiting for room in a full buffer returns,
	// so the consumer can stop, and no handler starts another message.
	// Nak only once the consumer has stopped, so the buffered messages go
	// to other workers, not back to this one.
	w.queue.close()
	cc.Stop()
	<-cc.Closed()
	for _, msg := range w.queue.drain() {
		w.giveBack(msg)
	}
	w.refresh()
	w.wg.Wait()
	w.stop()
}

// giveBack naks a message fetched but never handled, so JetStream
// redelivers it now rather than after AckWait.
func (w *Worker) giveBack(msg jetstream.Msg) {
	w.settle(msg, msg.Nak, streamSeq(msg))
}

// streamSeq is msg's sequence in its stream, zero when it has no JetStream
// metadata.
func streamSeq(msg jetstream.Msg) uint64 {
	if md, err := msg.Metadata(); err == nil {
		return md.Sequence.Stream
	}
	return 0
}

// Handle answers one delivery: the whole per-message protocol, exported so
// tests can drive it message by message. A request the engine cannot start
// yet (OutcomeDelayed) is naked with its Retry-After here; the worker's own
// handlers keep such a request instead, without a redelivery (see
// fairQueue.postpone).
func (w *Worker) Handle(ctx context.Context, msg jetstream.Msg) {
	if wait, delayed := w.run(ctx, msg); delayed {
		w.settle(msg, func() error { return msg.NakWithDelay(wait) }, streamSeq(msg))
	}
}

// run handles one delivery, traced and observed. For a request the engine
// could not start yet it settles nothing and returns its Retry-After: the
// caller keeps the message or gives it back.
func (w *Worker) run(ctx context.Context, msg jetstream.Msg) (wait time.Duration, delayed bool) {
	ctx, span := w.startSpan(ctx, msg)
	outcome, redelivered, wait := w.handle(ctx, msg)
	endSpan(span, outcome)
	if w.opts.Observer != nil {
		w.opts.Observer.Message(outcome, redelivered)
	}
	return wait, outcome == OutcomeDelayed
}

func (w *Worker) handle(ctx context.Context, msg jetstream.Msg) (outcome string, redelivered bool, wait time.Duration) {
	md, err := msg.Metadata()
	if err != nil {
		// Not a JetStream message: nothing to ack.
		w.log.Error("charge request without JetStream metadata", "subject", msg.Subject(), "err", err)
		return OutcomeError, false, 0
	}
	redelivered = md.NumDelivered > 1
	last := md.NumDelivered >= uint64(w.opts.MaxDeliver) //nolint:gosec // G115: MaxDeliver > 0, NewWorker replaces anything lower with DefaultMaxDeliver
	seq := md.Sequence.Stream
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.opts.WriteTimeout)
	defer cancel()

	merchant, ok := merchantOf(msg.Subject())
	if !ok {
		// The consumer's filter makes this unreachable; never block on it.
		w.log.Error("charge request on a subject without a merchant; terminated", "subject", msg.Subject(), "seq", seq)
		w.settle(msg, msg.Term, seq)
		return OutcomePoison, redelivered, 0
	}
	rawKeys := msg.Headers().Values(HeaderIdempotencyKey)
	key, err := idempotency.ParseKey(rawKeys)
	if err != nil {
		raw := ""
		if len(rawKeys) > 0 {
			raw = rawKeys[0]
		}
		return w.poison(wctx, msg, merchant, raw, seq, err), redelivered, 0
	}
	if err := CheckMerchant(merchant); err != nil {
		return w.poison(wctx, msg, merchant, key, seq, err), redelivered, 0
	}
	req, err := DecodeRequest(msg.Headers(), msg.Data())
	if err != nil {
		return w.poison(wctx, msg, merchant, key, seq, err), redelivered, 0
	}
	later := func() error { return msg.NakWithDelay(w.nakDelay(md.NumDelivered)) }
	d := delivery{msg: msg, merchant: merchant, key: key, seq: seq, delivered: md.NumDelivered, last: last}

	resp, err := req.run(ctx, w.engine, merchant, key)
	switch code := chargeonce.ErrorCode(err); {
	case err == nil && resp.Status == 202:
		// The acquirer's outcome is unknown; recovery settles it, and the
		// outbox publishes the answer then.
		return w.awaitSettlement(wctx, d), redelivered, 0
	case err == nil:
		r := Result{Merchant: merchant, Key: key, Status: resp.Status, Body: resp.Body, Replayed: resp.Replayed}
		if perr := publish(wctx, w.js, r.Msg()); perr != nil {
			// Stored, but not published: the redelivery replays it.
			w.log.WarnContext(wctx, "publishing a result failed; the request will be redelivered", "merchant", merchant, "key_hash", idempotency.KeyHash(merchant, key), "err", perr)
			w.settle(msg, later, seq)
			return OutcomeError, redelivered, 0
		}
		w.settle(msg, msg.Ack, seq)
		if resp.Replayed {
			return OutcomeReplayed, redelivered, 0
		}
		return OutcomeAnswered, redelivered, 0
	case code == chargeonce.ERATELIMITED || code == chargeonce.EOVERLOADED:
		// Not started, nothing kept: a delay, not a failed delivery. The
		// caller keeps the request and tries it again after Retry-After.
		return OutcomeDelayed, redelivered, max(chargeonce.ErrorRetryAfter(err), minPostpone)
	case code == chargeonce.EINPROGRESS:
		if last {
			// No more redeliveries: hand the answer to the outbox instead.
			return w.awaitSettlement(wctx, d), redelivered, 0
		}
		w.settle(msg, later, seq)
		return OutcomeInProgress, redelivered, 0
	case code == chargeonce.EINVALID:
		// A request the store or the engine found invalid (text no store
		// keeps, manual capture with an acquirer that cannot capture): as
		// a body that never decodes.
		return w.poison(wctx, msg, merchant, key, seq, err), redelivered, 0
	case refused(code):
		// An operation on a charge refused with nothing kept for the key:
		// this message's answer, as HTTP gives it. The same key may be
		// sent again (more may be refundable once another refund failed;
		// a charge is authorized again once its capture failed).
		status, body := wire.Problem(err, "")
		r := Result{Merchant: merchant, Key: key, Status: status, Body: body, RequestSeq: seq}
		if perr := publish(wctx, w.js, r.Msg()); perr != nil {
			w.log.WarnContext(wctx, "publishing a refused request's result failed; the request will be redelivered", "merchant", merchant, "key_hash", idempotency.KeyHash(merchant, key), "err", perr)
			w.settle(msg, later, seq)
			return OutcomeError, redelivered, 0
		}
		w.settle(msg, msg.Ack, seq)
		return OutcomeRefused, redelivered, 0
	case code == chargeonce.EKEYREUSED:
		status, body := wire.Problem(err, "")
		r := Result{Merchant: merchant, Key: key, Status: status, Body: body, RequestSeq: seq}
		if perr := publish(wctx, w.js, r.Msg()); perr != nil {
			w.log.WarnContext(wctx, "publishing a 422 result failed; the request will be redelivered", "merchant", merchant, "key_hash", idempotency.KeyHash(merchant, key), "err", perr)
			w.settle(msg, later, seq)
			return OutcomeError, redelivered, 0
		}
		w.settle(msg, msg.Ack, seq)
		return OutcomeRejected, redelivered, 0
	default:
		// 5xx: nothing was stored (the engine released the key, or never
		// wrote it), so the request is simply tried again later.
		if last {
			return w.giveUp(wctx, d, err), redelivered, 0
		}
		w.log.WarnContext(wctx, "charge request failed; redelivering later", "merchant", merchant, "key_hash", idempotency.KeyHash(merchant, key), "seq", seq, "err", err)
		w.settle(msg, later, seq)
		return OutcomeError, redelivered, 0
	}
}

// DecodeRefundRequest decodes a refund request: the HeaderRefundOf values
// (exactly one charge id, visible ASCII) and the body, a refund request
// whose absence refunds what remains. Errors are EINVALID naming the header
// or field, or ETOOLARGE, as the HTTP API gives them.
func DecodeRefundRequest(refundOf []string, body []byte) (string, chargeonce.RefundRequest, error) {
	var req chargeonce.RefundRequest
	id, err := chargeOf(HeaderRefundOf, refundOf)
	if err != nil {
		return "", req, err
	}
	if req, err = wire.DecodeRefundRequest(body); err != nil {
		return "", req, err
	}
	return id, req, nil
}

// refused reports whether code is the engine's refusal of an operation on
// a charge that wrote nothing: no such charge, a refund of a charge not
// captured or past what remains, a capture or cancel of a charge not
// authorized (or already held by another), a capture past what was
// authorized. Each is a final answer for the message, never a failure to
// redeliver: the charge's state, not an outage, decided it.
func refused(code string) bool {
	switch code {
	case chargeonce.ENOTFOUND, chargeonce.ENOTREFUNDABLE, chargeonce.EREFUNDEXCEEDS,
		chargeonce.ENOTAUTHORIZED, chargeonce.ECAPTUREEXCEEDS:
		return true
	}
	return false
}

// delivery is one delivery of a well-formed request, as the steps after the
// engine need it.
type delivery struct {
	msg           jetstream.Msg
	merchant, key string
	seq           uint64
	delivered     uint64
	// last is the worker's last delivery of it (MaxDeliver): a failure now
	// gives the request up (giveUp) instead of naking it.
	last bool
}

// awaitSettlement makes sure the answer of an intent still processing is
// published when it settles, then acks: the flag makes whoever completes
// the record write the outbox row in the same statement; if the record
// completed before the flag landed, its stored answer is published here.
// What fails is tried again at a redelivery, or, at the last delivery,
// ends in giveUp.
func (w *Worker) awaitSettlement(ctx context.Context, d delivery) string {
	msg, merchant, key, seq := d.msg, d.merchant, d.key, d.seq
	nak := func() error { return msg.NakWithDelay(time.Second) }
	flagged, err := w.store.KeyNotify(ctx, merchant, key)
	if err != nil {
		if d.last {
			return w.giveUp(ctx, d, fmt.Errorf("flagging the record for the outbox: %w", err))
		}
		w.log.WarnContext(ctx, "flagging a record for the outbox failed; the request will be redelivered", "merchant", merchant, "key_hash", idempotency.KeyHash(merchant, key), "err", err)
		w.settle(msg, nak, seq)
		return OutcomeError
	}
	if flagged {
		w.settle(msg, msg.Ack, seq)
		return OutcomeOutbox
	}
	rec, err := w.store.KeyGet(ctx, merchant, key)
	if err != nil || rec.State != chargeonce.KeyCompleted {
		// Gone (released before the acquirer was called) or unreadable:
		// the redelivery runs the request again.
		if d.last {
			return w.giveUp(ctx, d, errors.New("the record was neither flagged nor completed"))
		}
		w.settle(msg, nak, seq)
		return OutcomeError
	}
	r := Result{Merchant: merchant, Key: key, Status: rec.ResponseStatus, Body: rec.ResponseBody}
	if err := publish(ctx, w.js, r.Msg()); err != nil {
		w.log.WarnContext(ctx, "publishing a settled result failed; the request will be redelivered", "merchant", merchant, "key_hash", idempotency.KeyHash(merchant, key), "err", err)
		w.settle(msg, nak, seq)
		return OutcomeError
	}
	w.settle(msg, msg.Ack, seq)
	return OutcomeAnswered
}

// giveUp ends a request that still fails at its last delivery, so that it
// is answered all the same: JetStream will not deliver it again (or only
// in the room ConsumerConfig leaves for a give-up that fails). What the
// sender is told depends on the intent's record:
//
//   - processing: flagged for the outbox, which publishes its answer when
//     it settles, and the request is acked, as for a 409 at the last
//     delivery;
//   - completed: its stored answer is published and the request acked;
//   - none: a final 503 unavailable result for this request says that it
//     was given up and that nothing is kept for its key, so sending it again
//     with the same key charges it;
//   - unreadable: a final 503 says it was given up and that whether its
//     intent was started is unknown; sending it again with the same key
//     gets the stored answer if there is one, and charges once otherwise.
//
// A request answered 503 is copied to charges.dead (max-deliveries) and
// terminated. When even that cannot be published, it is naked: the give-up
// is tried again at the next delivery.
func (w *Worker) giveUp(ctx context.Context, d delivery, cause error) string {
	msg, merchant, key, seq := d.msg, d.merchant, d.key, d.seq
	log := w.log.With("merchant", merchant, "key_hash", idempotency.KeyHash(merchant, key), "seq", seq, "deliveries", d.delivered)
	nak := func() error { return msg.NakWithDelay(w.nakDelay(d.delivered)) }
	flagged, nerr := w.store.KeyNotify(ctx, merchant, key)
	if nerr == nil && flagged {
		log.WarnContext(ctx, "charge request still failing at its last delivery; its intent is in flight, handed to the outbox", "err", cause)
		w.settle(msg, msg.Ack, seq)
		return OutcomeOutbox
	}
	rec, gerr := w.store.KeyGet(ctx, merchant, key)
	if gerr == nil && rec.State == chargeonce.KeyCompleted {
		r := Result{Merchant: merchant, Key: key, Status: rec.ResponseStatus, Body: rec.ResponseBody}
		if err := publish(ctx, w.js, r.Msg()); err != nil {
			log.WarnContext(ctx, "publishing the stored answer of a request given up failed; it will be redelivered", "err", err)
			w.settle(msg, nak, seq)
			return OutcomeError
		}
		log.WarnContext(ctx, "charge request still failing at its last delivery; its intent's stored answer published", "err", cause)
		w.settle(msg, msg.Ack, seq)
		return OutcomeAnswered
	}
	gaveUp := fmt.Sprintf("the worker gave up on this request after %d deliveries that failed; ", d.delivered)
	// The store's errors may quote the key: the log says only what was found.
	record := "unreadable"
	switch {
	case chargeonce.ErrorCode(gerr) == chargeonce.ENOTFOUND:
		record = "none"
		gaveUp += "nothing is kept for this Idempotency-Key: send the request again, with the same key, to charge it"
	case gerr == nil:
		record = "processing, not flagged"
		fallthrough
	default:
		gaveUp += "whether this Idempotency-Key's intent was started is unknown: send the request again with the same key, which answers the stored outcome if there is one and charges once if there is none"
	}
	status, body := wire.Problem(chargeonce.Errorf(chargeonce.EUNAVAILABLE, "%s", gaveUp), "")
	r := Result{Merchant: merchant, Key: key, Status: status, Body: body, RequestSeq: seq}
	err := publish(ctx, w.js, r.Msg())
	if err == nil {
		err = w.deadLetter(ctx, msg, merchant, seq, "max-deliveries")
	}
	if err != nil {
		log.WarnContext(ctx, "giving up a charge request failed; it will be redelivered", "err", err)
		w.settle(msg, nak, seq)
		return OutcomeError
	}
	log.ErrorContext(ctx, "charge request still failing at its last delivery; given up (503 result, dead-lettered)", "err", cause, "record", record)
	w.settle(msg, msg.Term, seq)
	return OutcomeGaveUp
}

// poison answers a request that can never succeed (no or malformed key,
// malformed JSON, invalid fields, too large) with the exact problem the HTTP
// API gives, copies it to charges.dead.<merchant> and terminates it, so it
// never blocks the stream.
func (w *Worker) poison(ctx context.Context, msg jetstream.Msg, merchant, key string, seq uint64, cause error) string {
	status, body := wire.Problem(cause, "")
	r := Result{Merchant: merchant, Key: key, Status: status, Body: body, RequestSeq: seq}
	err := publish(ctx, w.js, r.Msg())
	if err == nil {
		err = w.deadLetter(ctx, msg, merchant, seq, chargeonce.ErrorCode(cause))
	}
	if err != nil {
		w.log.WarnContext(ctx, "answering a poison request failed; it will be redelivered", "merchant", merchant, "seq", seq, "err", err)
		w.settle(msg, func() error { return msg.NakWithDelay(time.Second) }, seq)
		return OutcomeError
	}
	w.log.InfoContext(ctx, "poison charge request dead-lettered", "merchant", merchant, "seq", seq, "reason", chargeonce.ErrorCode(cause))
	w.settle(msg, msg.Term, seq)
	return OutcomePoison
}

// deadLetter copies the request, headers and body, to charges.dead. A body
// over DeadMaxBody is cut to it (HeaderDeadTruncated says so), so a huge
// poison message cannot fill the results stream.
func (w *Worker) deadLetter(ctx context.Context, msg jetstream.Msg, merchant string, seq uint64, reason string) error {
	d := nats.NewMsg(DeadSubject(merchant))
	for k, vs := range msg.Headers() {
		if k == jetstream.MsgIDHeader {
			continue
		}
		d.Header[k] = append([]string(nil), vs...)
	}
	d.Header.Set(HeaderDeadReason, reason)
	d.Header.Set(HeaderRequestSeq, strconv.FormatUint(seq, 10))
	d.Header.Set(jetstream.MsgIDHeader, "dead-"+strconv.FormatUint(seq, 10))
	d.Data = msg.Data()
	if len(d.Data) > DeadMaxBody {
		d.Header.Set(HeaderDeadTruncated, strconv.Itoa(len(d.Data)))
		d.Data = d.Data[:DeadMaxBody]
	}
	if err := publish(ctx, w.js, d); err != nil {
		return err
	}
	if w.opts.Observer != nil {
		w.opts.Observer.DeadLetter(reason)
	}
	return nil
}

// settle acks, naks or terminates. A lost ack only means a redelivery,
// which replays, so failures are logged and nothing more.
func (w *Worker) settle(msg jetstream.Msg, f func() error, seq uint64) {
	if err := f(); err != nil {
		w.log.Warn("acknowledging a charge request failed; it may be redelivered", "seq", seq, "err", err)
	}
}

// nakDelay is 1 s doubling per delivery, capped at NakDelayMax.
func (w *Worker) nakDelay(delivered uint64) time.Duration {
	d := time.Second
	for i := uint64(1); i < delivered && d < w.opts.NakDelayMax; i++ {
		d *= 2
	}
	return min(d, w.opts.NakDelayMax)
}
