// Package queue is chargeonce's queue transport (SPEC "Queue mode"): charge
// requests arrive as NATS JetStream messages, go through the same decoder
// and the same engine as POST /v1/charges, and their answers — the exact
// status and bytes the HTTP API gives — are published as result messages.
//
// It is an adapter like httpapi, never a second protocol: the idempotency
// record, the stored response and recovery are the engine's and the store's.
// What the queue adds is delivery: a message is acked only once its outcome
// is durably stored (or handled elsewhere), and an outcome the engine cannot
// know yet (202) is published later through a transactional outbox, by
// whichever worker drains it, whoever settles the charge.
package queue

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/chargeonce/chargeonce"
)

// Stream and subject names: the contract clients depend on (SPEC).
const (
	// RequestStream holds charge requests, on RequestSubjectPrefix+<merchant>.
	RequestStream        = "CHARGES"
	RequestSubjectPrefix = "charges.request."
	// ResultStream holds results (ResultSubjectPrefix+<merchant>) and copies
	// of poison requests (DeadSubjectPrefix+<merchant>).
	ResultStream        = "CHARGE_RESULTS"
	ResultSubjectPrefix = "charges.result."
	DeadSubjectPrefix   = "charges.dead."
)

// Header names on requests and results.
const (
	HeaderIdempotencyKey = "Idempotency-Key"
	HeaderStatus         = "Status"
	HeaderReplayed       = "Idempotent-Replayed"
	HeaderContentType    = "Content-Type"
	// HeaderDeadReason says why a request was dead-lettered: the problem
	// slug of its 400 (validation-failed, missing-idempotency-key, …) or
	// max-deliveries.
	HeaderDeadReason = "Chargeonce-Dead-Reason"
	// HeaderDeadTruncated is on a dead-letter copy whose body was cut to
	// DeadMaxBody bytes: the original body's size in bytes.
	HeaderDeadTruncated = "Chargeonce-Dead-Truncated"
	// HeaderRequestSeq names the request's sequence in RequestStream, on
	// results that answer one message rather than the intent (400, 422) and
	// on dead-letter copies.
	HeaderRequestSeq = "Chargeonce-Request-Seq"
	// HeaderRefundOf makes a request a refund of the charge it names (a
	// ch_… id): its body is a refund request ({"amount_cents"?, "reason"?,
	// "metadata"?}, empty for what remains), run by the engine's Refund
	// under the message's Idempotency-Key, and its result is published as
	// a charge's is. HeaderCaptureOf and HeaderCancelOf (operation.go)
	// are its siblings; a request carries at most one of the three.
	HeaderRefundOf = "Chargeonce-Refund-Of"
)

// DeadMaxBody bounds the body of a dead-letter copy: a request's body
// beyond it (no valid request is that large: POST /v1/charges refuses more
// than 64 KiB) is cut off, and HeaderDeadTruncated gives its size.
const DeadMaxBody = 64 << 10

// Defaults of StreamOptions. Both streams are bounded in age, bytes and
// message size. CHARGES refuses new requests when full (DiscardNew: the
// producer's publish fails and it retries later) rather than dropping
// requests nobody has answered; CHARGE_RESULTS drops its oldest results.
const (
	DefaultRequestMaxAge = 24 * time.Hour
	DefaultResultMaxAge  = 7 * 24 * time.Hour
	// DefaultRequestMaxBytes and DefaultResultMaxBytes bound each stream's
	// storage (on every replica).
	DefaultRequestMaxBytes = 1 << 30
	DefaultResultMaxBytes  = 1 << 30
	// DefaultRequestMaxMsgSize admits an oversized request (NATS's own
	// default max_payload is 1 MiB) so that it is answered 413 and
	// dead-lettered, truncated, rather than refused unseen.
	DefaultRequestMaxMsgSize = 1 << 20
	// DefaultResultMaxMsgSize fits every result (a charge object or a
	// problem) and every dead-letter copy (DeadMaxBody and its headers).
	DefaultResultMaxMsgSize = DeadMaxBody + 64<<10
	// DefaultDuplicates is JetStream's duplicate window on the results
	// stream, whose message ids are chargeonce's own (scoped by merchant):
	// it keeps one copy of an answer published twice (by the outbox and a
	// replay, say). Correctness never depends on it.
	DefaultDuplicates = 2 * time.Minute
	// DefaultRequestDuplicates is the duplicate window on the requests
	// stream: the shortest JetStream allows. JetStream dedupes Nats-Msg-Id
	// across the whole stream, whatever the subject, so a longer window
	// would let one merchant's id make another merchant's message vanish
	// (acked as a duplicate, never stored). The engine dedupes requests by
	// merchant and key, so nothing is lost by (almost) not deduping here.
	DefaultRequestDuplicates = 100 * time.Millisecond
)

// RequestSubject is the subject a merchant's charge requests are sent to.
func RequestSubject(merchant string) string { return RequestSubjectPrefix + merchant }

// ResultSubject is the subject a merchant's results are published to.
func ResultSubject(merchant string) string { return ResultSubjectPrefix + merchant }

// DeadSubject is the subject a merchant's poison requests are copied to.
func DeadSubject(merchant string) string { return DeadSubjectPrefix + merchant }

// RequestMsgID is the Nats-Msg-Id producers should give a request:
// merchant, key and send (one sending of the message, the same on the
// producer's own retries of that publish), joined by colons. JetStream
// dedupes message ids across the whole stream, whatever the subject, so an
// id must be unique to its merchant; a merchant id never holds a colon
// (CheckMerchant), so no merchant's ids can be another's.
func RequestMsgID(merchant, key, send string) string {
	return merchant + ":" + key + ":" + send
}

// DetectReplicas is how many replicas the streams should have on the
// deployment nc is connected to: 3 on a JetStream cluster of three or more
// servers (a node may fail, or be upgraded, with no acknowledged message
// lost), 1 on a single server. A single server keeps acknowledged
// messages through a power loss only with sync_interval: always (see
// docs/queue.md).
func DetectReplicas(nc *nats.Conn) int {
	if nc.ConnectedClusterName() == "" || len(nc.Servers()) < 3 {
		return 1
	}
	return 3
}

// StreamOptions configure EnsureStreams. Zero fields take the defaults.
type StreamOptions struct {
	// Replicas of each stream (1 on a single server; 3 in a cluster).
	Replicas      int
	RequestMaxAge time.Duration
	ResultMaxAge  time.Duration
	// Duplicates is the results stream's duplicate window.
	Duplicates time.Duration
	// RequestDuplicates is the requests stream's duplicate window.
	RequestDuplicates time.Duration
	// RequestMaxBytes and ResultMaxBytes bound each stream's storage.
	RequestMaxBytes int64
	ResultMaxBytes  int64
}

// EnsureStreams creates both streams, or updates them to this
// configuration, asking again while JetStream does not answer in time
// (untilAnswered), until ctx ends. Several workers may run it at once.
func EnsureStreams(ctx context.Context, js jetstream.JetStream, o StreamOptions) error {
	if o.Replicas <= 0 {
		o.Replicas = 1
	}
	if o.RequestMaxAge <= 0 {
		o.RequestMaxAge = DefaultRequestMaxAge
	}
	if o.ResultMaxAge <= 0 {
		o.ResultMaxAge = DefaultResultMaxAge
	}
	if o.Duplicates <= 0 {
		o.Duplicates = DefaultDuplicates
	}
	if o.RequestDuplicates <= 0 {
		o.RequestDuplicates = DefaultRequestDuplicates
	}
	if o.RequestMaxBytes <= 0 {
		o.RequestMaxBytes = DefaultRequestMaxBytes
	}
	if o.ResultMaxBytes <= 0 {
		o.ResultMaxBytes = DefaultResultMaxBytes
	}
	for _, cfg := range []jetstream.StreamConfig{{
		Name:        RequestStream,
		Description: "chargeonce charge requests",
		Subjects:    []string{RequestSubjectPrefix + "*"},
		Storage:     jetstream.FileStorage,
		Replicas:    o.Replicas,
		MaxAge:      o.RequestMaxAge,
		MaxBytes:    o.RequestMaxBytes,
		MaxMsgSize:  DefaultRequestMaxMsgSize,
		Discard:     jetstream.DiscardNew,
		Duplicates:  o.RequestDuplicates,
	}, {
		Name:        ResultStream,
		Description: "chargeonce charge results and dead-lettered requests",
		Subjects:    []string{ResultSubjectPrefix + "*", DeadSubjectPrefix + "*"},
		Storage:     jetstream.FileStorage,
		Replicas:    o.Replicas,
		MaxAge:      o.ResultMaxAge,
		MaxBytes:    o.ResultMaxBytes,
		MaxMsgSize:  DefaultResultMaxMsgSize,
		Discard:     jetstream.DiscardOld,
		Duplicates:  o.Duplicates,
	}} {
		if _, err := untilAnswered(ctx, func() (jetstream.Stream, error) {
			return js.CreateOrUpdateStream(ctx, cfg)
		}, nil); err != nil {
			return fmt.Errorf("creating or updating stream %s: %w", cfg.Name, err)
		}
	}
	return nil
}

// Result is one result message: what the HTTP API answers the same attempt.
type Result struct {
	Merchant string
	// Key is the parsed Idempotency-Key; for a request without a valid key
	// it is the raw header value, if any, so the sender can still match it.
	Key      string
	Status   int
	Body     []byte
	Replayed bool
	// RequestSeq is the request's stream sequence for answers about one
	// message (400, 413, 422); zero for an intent's stored answer.
	RequestSeq uint64
}

// MsgID is the result's Nats-Msg-Id. An intent's stored answer gets an id
// derived from merchant, key and status alone, so every worker that
// publishes it (directly, again for a duplicate request, or from the outbox)
// publishes the same id and JetStream keeps one copy within its duplicate
// window. An answer about one message is identified by that message.
func (r Result) MsgID() string {
	if r.RequestSeq != 0 {
		return "req-" + strconv.FormatUint(r.RequestSeq, 10) + "-" + strconv.Itoa(r.Status)
	}
	h := sha256.New()
	h.Write([]byte(r.Merchant))
	h.Write([]byte{0})
	h.Write([]byte(r.Key))
	h.Write([]byte{0})
	h.Write([]byte(strconv.Itoa(r.Status)))
	return "res-" + hex.EncodeToString(h.Sum(nil)[:16])
}

// Msg builds the result message.
func (r Result) Msg() *nats.Msg {
	m := nats.NewMsg(ResultSubject(r.Merchant))
	if r.Key != "" {
		m.Header.Set(HeaderIdempotencyKey, r.Key)
	}
	m.Header.Set(HeaderStatus, strconv.Itoa(r.Status))
	ct := "application/json"
	if r.Status >= 400 {
		ct = "application/problem+json"
	}
	m.Header.Set(HeaderContentType, ct)
	if r.Replayed {
		m.Header.Set(HeaderReplayed, "true")
	}
	if r.RequestSeq != 0 {
		m.Header.Set(HeaderRequestSeq, strconv.FormatUint(r.RequestSeq, 10))
	}
	m.Header.Set(jetstream.MsgIDHeader, r.MsgID())
	m.Data = r.Body
	return m
}

// publish sends m to JetStream and waits for the stream's acknowledgement.
func publish(ctx context.Context, js jetstream.JetStream, m *nats.Msg) error {
	// The span handling the request, if any, goes on with the result.
	InjectTrace(ctx, m)
	_, err := js.PublishMsg(ctx, m, jetstream.WithExpectStream(ResultStream))
	if err != nil {
		return fmt.Errorf("publishing to %s: %w", m.Subject, err)
	}
	return nil
}

// merchantOf returns the merchant named by a request subject's last token.
func merchantOf(subject string) (string, bool) {
	m, ok := strings.CutPrefix(subject, RequestSubjectPrefix)
	if !ok || m == "" || strings.ContainsAny(m, ".*> ") {
		return "", false
	}
	return m, true
}

// MaxMerchantLen bounds a merchant id, in bytes.
const MaxMerchantLen = 255

// CheckMerchant refuses a merchant token no merchant on the queue can have:
// 1–MaxMerchantLen visible ASCII characters (0x21–0x7E) other than a colon
// (merchant ids never hold one: the API keys are merchant:secret, and
// message ids are merchant:key:…) and other than the subject's own
// separators and wildcards (. * >). Anything else on a request subject is
// poison, answered 400 at its first delivery; without this check a token
// that is not UTF-8 reached the store, which refused it like an outage,
// and the request was retried for minutes before it was given up.
func CheckMerchant(m string) error {
	if m == "" || len(m) > MaxMerchantLen {
		return chargeonce.FieldError("merchant", "the subject's merchant token must be 1 to %d characters", MaxMerchantLen)
	}
	for i := range len(m) {
		if c := m[i]; c < 0x21 || c > 0x7e || strings.IndexByte(":.*>", c) >= 0 {
			return chargeonce.FieldError("merchant", "the subject's merchant token must be visible ASCII characters other than : . * >")
		}
	}
	return nil
}

// retryUnanswered is how long untilAnswered waits before asking again.
const retryUnanswered = 250 * time.Millisecond

// untilAnswered makes a JetStream API call, and makes it again while it is
// not answered in time (the API's timeout: a cluster electing a leader, or
// too busy to create a replicated stream or consumer within it) and ctx
// lasts; an answer, an error included, ends it. Only idempotent calls go
// through it: creating or updating a stream or consumer to one
// configuration, which a request that took effect unseen does not change.
// unanswered, when not nil, hears of each retry.
func untilAnswered[T any](ctx context.Context, call func() (T, error), unanswered func(attempt int, err error)) (T, error) {
	for attempt := 1; ; attempt++ {
		v, err := call()
		timedOut := errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout)
		if err == nil || ctx.Err() != nil || !timedOut {
			return v, err
		}
		if unanswered != nil {
			unanswered(attempt, err)
		}
		select {
		case <-ctx.Done():
			return v, ctx.Err()
		case <-time.After(retryUnanswered):
		}
	}
}
