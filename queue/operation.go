package queue

import (
	"context"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/wire"
)

// Headers that make a request an operation on an existing charge rather
// than a new charge. Each names the charge (a ch_… id), as the path does
// over HTTP; a request carries at most one of them (HeaderRefundOf is the
// first of the family).
const (
	// HeaderCaptureOf makes a request a capture of the authorized charge
	// it names (POST /v1/charges/{id}/capture): its body is empty, {} (the
	// whole authorization) or {"amount_cents": n} (n at most what was
	// authorized), run by the engine's Capture under the message's
	// Idempotency-Key.
	HeaderCaptureOf = "Chargeonce-Capture-Of"
	// HeaderCancelOf makes a request a cancel (void) of the authorized
	// charge it names (POST /v1/charges/{id}/cancel): its body is empty or
	// {}, run by the engine's Cancel under the message's Idempotency-Key.
	HeaderCancelOf = "Chargeonce-Cancel-Of"
)

// operationHeaders are the headers naming an operation on a charge, with
// the kind of request each makes.
var operationHeaders = []struct {
	header string
	kind   chargeonce.RecordKind
}{
	{HeaderRefundOf, chargeonce.KindRefund},
	{HeaderCaptureOf, chargeonce.KindCapture},
	{HeaderCancelOf, chargeonce.KindCancel},
}

// Request is a decoded request message: a new charge (Kind
// chargeonce.KindCharge, the default) or a refund, capture or cancel of
// the charge ChargeID. Only the field of its kind is set.
type Request struct {
	Kind     chargeonce.RecordKind
	ChargeID string
	Charge   chargeonce.ChargeRequest
	Refund   chargeonce.RefundRequest
	Capture  chargeonce.CaptureBody
}

// DecodeRequest decodes a request from its headers and body, as the HTTP
// API decodes the same request from its path and body: with none of the
// operation headers it is a charge (the body of POST /v1/charges); with
// one of them, exactly once, an operation on the charge it names. Errors
// are EINVALID naming the header or field, or ETOOLARGE, and the message
// can never succeed: it is poison.
func DecodeRequest(h nats.Header, body []byte) (Request, error) {
	var r Request
	var header string
	for _, o := range operationHeaders {
		if len(h.Values(o.header)) == 0 {
			continue
		}
		if header != "" {
			return r, chargeonce.FieldError(o.header, "send at most one of %s, %s and %s; got both %s and %s",
				HeaderRefundOf, HeaderCaptureOf, HeaderCancelOf, header, o.header)
		}
		header, r.Kind = o.header, o.kind
	}
	var err error
	switch r.Kind {
	case chargeonce.KindRefund:
		r.ChargeID, r.Refund, err = DecodeRefundRequest(h.Values(HeaderRefundOf), body)
	case chargeonce.KindCapture:
		if r.ChargeID, err = chargeOf(HeaderCaptureOf, h.Values(HeaderCaptureOf)); err == nil {
			r.Capture, err = wire.DecodeCaptureBody(body)
		}
	case chargeonce.KindCancel:
		if r.ChargeID, err = chargeOf(HeaderCancelOf, h.Values(HeaderCancelOf)); err == nil {
			err = decodeOptional(body, &struct{}{})
		}
	default:
		r.Charge, err = wire.DecodeChargeRequest(body)
	}
	return r, err
}

// run runs the request through eng for merchant under key.
func (r *Request) run(ctx context.Context, eng *engine.Engine, merchant, key string) (engine.Response, error) {
	switch r.Kind {
	case chargeonce.KindRefund:
		return eng.Refund(ctx, merchant, r.ChargeID, key, &r.Refund)
	case chargeonce.KindCapture:
		return eng.Capture(ctx, merchant, r.ChargeID, key, &r.Capture)
	case chargeonce.KindCancel:
		return eng.Cancel(ctx, merchant, r.ChargeID, key)
	}
	return eng.Charge(ctx, merchant, key, &r.Charge)
}

// MaxChargeIDLen bounds the charge id an operation's header names.
const MaxChargeIDLen = 255

// chargeOf returns the charge id that header's values name: exactly one
// value, 1 to MaxChargeIDLen visible ASCII characters.
func chargeOf(header string, values []string) (string, error) {
	if len(values) != 1 {
		return "", chargeonce.FieldError(header, "send exactly one %s header naming the charge; got %d", header, len(values))
	}
	id := values[0]
	ok := id != "" && len(id) <= MaxChargeIDLen
	for i := 0; ok && i < len(id); i++ {
		ok = id[i] > ' ' && id[i] < 0x7f
	}
	if !ok {
		return "", chargeonce.FieldError(header, "%s must be a charge id: 1 to %d visible ASCII characters", header, MaxChargeIDLen)
	}
	return id, nil
}

// decodeOptional decodes an operation's body strictly into v; a body that
// is empty or only white space leaves v as it is, as {} would. Over
// 64 KiB it is ETOOLARGE, as over HTTP.
func decodeOptional(body []byte, v any) error {
	if len(body) > wire.MaxBodyBytes {
		return wire.TooLarge()
	}
	if len(strings.TrimSpace(string(body))) == 0 {
		return nil
	}
	return wire.Decode(body, v)
}
