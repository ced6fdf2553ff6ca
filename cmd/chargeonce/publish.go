package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/client"
	"github.com/chargeonce/chargeonce/queue"
)

// DefaultMerchant is the merchant `publish` sends for.
const DefaultMerchant = "demo"

// publishConfig is everything `publish` is configured with.
type publishConfig struct {
	intentFlags
	natsURL, merchant string
	// refundOf, captureOf or cancelOf, when one is set, makes the request
	// a refund, a capture or a cancel of that charge.
	refundOf, reason    string
	captureOf, cancelOf string
	// captureMethod is a new charge's capture_method: "manual" authorizes
	// only, for a later --capture-of or --cancel-of.
	captureMethod string
}

// operation returns the header naming the charge the request operates on
// and the charge's id, or two empty strings for a new charge. More than
// one of --refund-of, --capture-of and --cancel-of is an error.
func (c *publishConfig) operation() (header, chargeID string, err error) {
	var flag string
	for _, o := range []struct{ flag, header, id string }{
		{"--refund-of", queue.HeaderRefundOf, c.refundOf},
		{"--capture-of", queue.HeaderCaptureOf, c.captureOf},
		{"--cancel-of", queue.HeaderCancelOf, c.cancelOf},
	} {
		if o.id == "" {
			continue
		}
		if header != "" {
			return "", "", fmt.Errorf("%s and %s: give at most one of --refund-of, --capture-of and --cancel-of", flag, o.flag)
		}
		flag, header, chargeID = o.flag, o.header, o.id
	}
	return header, chargeID, nil
}

// checkRequest refuses flags that make no request, naming the flag.
func (c *publishConfig) checkRequest(header string) error {
	if header == "" {
		return c.check()
	}
	switch {
	case c.amount < 0:
		return fmt.Errorf("--amount must not be negative; got %d", c.amount)
	case header == queue.HeaderCancelOf && c.amount != 0:
		return fmt.Errorf("--amount is not used with --cancel-of: a cancel releases the whole authorization")
	case header != queue.HeaderRefundOf && c.reason != "":
		return fmt.Errorf("--reason is only used with --refund-of")
	case c.captureMethod != "":
		return fmt.Errorf("--capture-method is only used for a new charge, not with --refund-of, --capture-of or --cancel-of")
	case c.timeout <= 0:
		return fmt.Errorf("--timeout must be positive; got %s", c.timeout)
	}
	return nil
}

// request is the request's body: a charge, or the operation header names.
func (c *publishConfig) request(header string) any {
	switch header {
	case queue.HeaderRefundOf:
		return chargeonce.RefundRequest{AmountCents: c.amount, Reason: c.reason}
	case queue.HeaderCaptureOf:
		return chargeonce.CaptureBody{AmountCents: c.amount}
	case queue.HeaderCancelOf:
		return struct{}{}
	}
	return chargeonce.ChargeRequest{OrderID: c.order, AmountCents: c.amount, Currency: c.currency, PaymentToken: c.token,
		Description: c.descr, CaptureMethod: chargeonce.CaptureMethod(c.captureMethod)}
}

// runPublish sends one charge request to charges.request.<merchant> and
// waits for its result on charges.result.<merchant>, printing its status,
// headers and body. With --refund-of, --capture-of or --cancel-of it sends
// a refund, a capture or a cancel (void) of that charge instead (header
// Chargeonce-Refund-Of, Chargeonce-Capture-Of or Chargeonce-Cancel-Of).
// Exit status: 0 for a success (201; 200 for a capture or cancel), 2 when
// the acquirer refused it (402: a declined card, a capture or cancel the
// acquirer failed), 1 anything else, including no result within --timeout
// (send again with the same --key to learn the outcome: the worker
// republishes it).
func runPublish(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var c publishConfig
	fs := newFlagSet("publish", stderr)
	fs.StringVar(&c.natsURL, "nats", DefaultNATS, "NATS server URL(s), comma-separated")
	fs.StringVar(&c.merchant, "merchant", DefaultMerchant, "merchant (the subject's last token)")
	c.register(fs, "idempotency key of this payment intent (default: a new random one, printed on stderr)", "how long to wait for the result")
	fs.StringVar(&c.refundOf, "refund-of", "", "send a refund of this charge (its ch_… id) instead of a charge: --amount is then what to refund (0 or left out: what remains), --order is not used")
	fs.StringVar(&c.reason, "reason", "", "with --refund-of: why, at most 500 characters")
	fs.StringVar(&c.captureOf, "capture-of", "", "send a capture of this authorized charge (its ch_… id, made with --capture-method manual) instead of a charge: --amount is then what to capture (0 or left out: all that was authorized), --order is not used")
	fs.StringVar(&c.cancelOf, "cancel-of", "", "send a cancel (void) of this authorized charge (its ch_… id) instead of a charge; --order and --amount are not used")
	fs.StringVar(&c.captureMethod, "capture-method", "", "a new charge's capture_method: manual only authorizes it, for a later --capture-of or --cancel-of (default: automatic)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	header, chargeID, err := c.operation()
	if err != nil {
		return err
	}
	if err := c.checkRequest(header); err != nil {
		return err
	}
	if c.merchant == "" {
		return fmt.Errorf("--merchant is required")
	}
	if err := queue.CheckMerchant(c.merchant); err != nil {
		return fmt.Errorf("--merchant %q: %s", c.merchant, chargeonce.ErrorMessage(err))
	}
	if c.key == "" {
		c.key = client.NewIdempotencyKey()
		fmt.Fprintf(stderr, "idempotency key: %s\n", c.key)
	}
	body, err := json.Marshal(c.request(header))
	if err != nil {
		return err
	}

	tr, stopTracing, err := startTracing(ctx, "publish", slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		return err
	}
	defer stopTracing()

	nc, err := nats.Connect(c.natsURL, nats.Name("chargeonce-publish"))
	if err != nil {
		return fmt.Errorf("--nats: connecting to %s: %w", c.natsURL, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err == nil {
		err = checkJetStream(ctx, js, c.natsURL)
	}
	if err != nil {
		return fmt.Errorf("--nats: %w", err)
	}
	// Subscribe before sending, so the result cannot pass by unseen. A
	// plain subscription sees every publish on the subject, including a
	// repeat that the stream drops as a duplicate.
	results := make(chan *nats.Msg, 64)
	sub, err := nc.ChanSubscribe(queue.ResultSubject(c.merchant), results)
	if err != nil {
		return fmt.Errorf("subscribing to results: %w", err)
	}
	// Unsubscribing fails only if the connection is already closed; nc.Close
	// drops the subscription in any case.
	defer func() { _ = sub.Unsubscribe() }()

	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	m := nats.NewMsg(queue.RequestSubject(c.merchant))
	m.Header.Set(queue.HeaderIdempotencyKey, c.key)
	m.Header.Set(queue.HeaderContentType, "application/json")
	if header != "" {
		m.Header.Set(header, chargeID)
	}
	// Scoped by merchant: JetStream dedupes ids across the whole stream.
	m.Header.Set(jetstream.MsgIDHeader, queue.RequestMsgID(c.merchant, c.key, client.NewIdempotencyKey()))
	m.Data = body
	// Traced, the worker's handling of this request joins this trace.
	pctx, endSpan := queue.TracePublish(ctx, tr.TracerProvider(), m)
	ack, err := js.PublishMsg(pctx, m, jetstream.WithExpectStream(queue.RequestStream))
	endSpan(err)
	if err != nil {
		return fmt.Errorf("sending the request: %w (is a worker running? it creates the streams)", err)
	}
	fmt.Fprintf(stderr, "sent to %s (stream %s, sequence %d); waiting for the result\n", m.Subject, ack.Stream, ack.Sequence)
	seq := strconv.FormatUint(ack.Sequence, 10)
	for {
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				fmt.Fprintf(stderr, "no result within %s; send again with --key %s to learn the outcome\n", c.timeout, c.key)
				return exitCodeError(1)
			}
			return ctx.Err()
		case r := <-results:
			// A result about one message carries its sequence; an
			// intent's answer carries its key.
			if s := r.Header.Get(queue.HeaderRequestSeq); s != "" && s != seq {
				continue
			}
			if r.Header.Get(queue.HeaderRequestSeq) == "" && r.Header.Get(queue.HeaderIdempotencyKey) != c.key {
				continue
			}
			status := r.Header.Get(queue.HeaderStatus)
			fmt.Fprintf(stdout, "%s: %s\n", queue.HeaderStatus, status)
			fmt.Fprintf(stdout, "%s: %s\n", queue.HeaderIdempotencyKey, r.Header.Get(queue.HeaderIdempotencyKey))
			if v := r.Header.Get(queue.HeaderReplayed); v != "" {
				fmt.Fprintf(stdout, "%s: %s\n", queue.HeaderReplayed, v)
			}
			fmt.Fprintf(stdout, "\n%s\n", r.Data)
			switch status {
			case "200", "201":
				return nil
			case "402":
				return exitCodeError(2)
			default:
				return exitCodeError(1)
			}
		}
	}
}
