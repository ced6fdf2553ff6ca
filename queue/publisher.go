package queue

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/internal/loop"
)

// Defaults of PublisherOptions.
const (
	DefaultOutboxEvery = time.Second
	DefaultOutboxBatch = 100
	// DefaultOutboxLease is how long a publisher holds the rows it claimed;
	// rows of a publisher that died are published by another after it.
	DefaultOutboxLease = 30 * time.Second
)

// PublisherOptions configure a Publisher. Zero fields take the defaults.
type PublisherOptions struct {
	Every    time.Duration
	Batch    int
	Lease    time.Duration
	Logger   *slog.Logger
	Observer Observer
}

// Publisher drains the outbox: the results of queue intents that were
// settled after their message was acked (by recovery in any worker or serve
// instance, or by an HTTP retry). It runs in every worker. A row is deleted
// only after JetStream acknowledged its message; a publisher that dies
// between the two leaves the row to be published again after its claim
// ends, with the same Nats-Msg-Id.
type Publisher struct {
	store chargeonce.Store
	js    jetstream.JetStream
	opts  PublisherOptions
	log   *slog.Logger

	loop loop.Loop
}

// NewPublisher returns a publisher of store's outbox to js.
func NewPublisher(store chargeonce.Store, js jetstream.JetStream, opts PublisherOptions) *Publisher {
	if opts.Every <= 0 {
		opts.Every = DefaultOutboxEvery
	}
	if opts.Batch <= 0 {
		opts.Batch = DefaultOutboxBatch
	}
	if opts.Lease <= 0 {
		opts.Lease = DefaultOutboxLease
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	return &Publisher{store: store, js: js, opts: opts, log: opts.Logger}
}

// RunOnce publishes every row it can claim, batch by batch, and returns how
// many it published. A row whose publish failed stays, and is tried again
// once its claim ends.
func (p *Publisher) RunOnce(ctx context.Context) (int, error) {
	published := 0
	var err error
	for ctx.Err() == nil {
		var es []chargeonce.OutboxEntry
		es, err = p.store.OutboxClaim(ctx, p.opts.Lease, p.opts.Batch)
		if err != nil {
			break
		}
		sent := make([]int64, 0, len(es))
		var perr error
		for _, e := range es {
			r := Result{Merchant: e.MerchantID, Key: e.Key, Status: e.ResponseStatus, Body: e.ResponseBody}
			pctx, cancel := context.WithTimeout(ctx, p.opts.Lease/2)
			perr = publish(pctx, p.js, r.Msg())
			cancel()
			if perr != nil {
				break
			}
			sent = append(sent, e.ID)
		}
		if len(sent) > 0 {
			// Detached: the messages are out; forgetting that would only
			// publish them again.
			mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.opts.Lease/2)
			err = p.store.OutboxMarkSent(mctx, sent)
			cancel()
			if err != nil {
				break
			}
			published += len(sent)
		}
		if perr != nil {
			err = perr
			break
		}
		if len(es) < p.opts.Batch {
			break
		}
	}
	if p.opts.Observer != nil {
		if st, serr := p.store.OutboxStats(context.WithoutCancel(ctx)); serr == nil {
			p.opts.Observer.Outbox(st, published)
		}
	}
	return published, err
}

// Start runs passes every opts.Every until Stop. It returns at once.
func (p *Publisher) Start(ctx context.Context) {
	p.loop.Start(ctx, p.opts.Every, true, p.pass)
}

// pass runs one pass and logs what it did.
func (p *Publisher) pass(ctx context.Context) {
	n, err := p.RunOnce(ctx)
	switch {
	case err != nil && !errors.Is(err, context.Canceled):
		p.log.Error("outbox pass failed", "published", n, "err", err)
	case n > 0:
		p.log.Info("outbox pass", "published", n)
	}
}

// Stop ends the loop and waits for the pass in flight.
func (p *Publisher) Stop() { p.loop.Stop() }
