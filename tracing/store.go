package tracing

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/chargeonce/chargeonce"
)

// Span attributes of chargeonce's own spans. Idempotency keys and API keys
// never go into a span (as into a log line): a key lets whoever holds it
// read an intent's stored answer.
const (
	AttrMerchant  = attribute.Key("chargeonce.merchant")
	AttrChargeID  = attribute.Key("chargeonce.charge_id")
	AttrInserted  = attribute.Key("chargeonce.inserted")
	AttrClaimed   = attribute.Key("chargeonce.claimed")
	AttrCount     = attribute.Key("chargeonce.count")
	AttrErrorCode = attribute.Key("chargeonce.error_code")
	AttrReference = attribute.Key("chargeonce.acquirer.reference")
	AttrStatus    = attribute.Key("chargeonce.acquirer.status")
	AttrDecline   = attribute.Key("chargeonce.acquirer.decline_code")
	AttrLookup    = attribute.Key("chargeonce.acquirer.lookup")
)

// Store returns s with every call in a client span of its own
// ("store.KeyInsert"), under the span of the request or message that made
// it, so a trace shows each store call and, beneath it, its statements (the
// PostgreSQL store's pgx tracer) or the batch it joined. system is the
// database (semconv's db.system.name: "postgresql", "sqlite"). Returns s
// itself when t is nil.
//
// Methods of chargeonce.Store this wrapper does not know pass through
// untraced (the interface is embedded). The store's optional capabilities,
// which code finds by asking the store for them (the webhook sender's
// chargeonce.ReconStore, the operators' chargeonce.OperatorStore), are kept:
// a store that has them all (both stores do) is wrapped with them, passing
// through untraced. The result is not a *postgres.Store: code that needs
// the concrete store (pool statistics) keeps the original.
func (t *Tracing) Store(s chargeonce.Store, system string) chargeonce.Store {
	if t == nil {
		return s
	}
	traced := &tracedStore{Store: s, tracer: t.tracer, system: semconv.DBSystemNameKey.String(system)}
	if c, ok := s.(capableStore); ok {
		return &tracedCapableStore{tracedStore: traced, OperatorStore: c, ReconStore: c, ReconOps: c}
	}
	return traced
}

// capableStore is a store with every optional capability of the root
// package (TestTracedStoreKeepsEveryCapability lists them and fails when
// the stores gain one the wrapper would drop).
type capableStore interface {
	chargeonce.Store
	chargeonce.OperatorStore // with chargeonce.HistoryAppender
	chargeonce.ReconStore
	chargeonce.ReconOps
}

// tracedCapableStore is a tracedStore that keeps the store's optional
// capabilities: their methods go to the store itself.
type tracedCapableStore struct {
	*tracedStore
	chargeonce.OperatorStore
	chargeonce.ReconStore
	chargeonce.ReconOps
}

type tracedStore struct {
	chargeonce.Store
	tracer trace.Tracer
	system attribute.KeyValue
}

func (s *tracedStore) start(ctx context.Context, op string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	attrs = append(attrs, s.system, semconv.DBOperationName(op))
	return s.tracer.Start(ctx, "store."+op, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
}

// end ends span, marking it failed when err is one: an answer the caller
// expects (not found, stale, in progress) is recorded by its code, not as an
// error.
func end(span trace.Span, err error) {
	if err != nil {
		code := chargeonce.ErrorCode(err)
		span.SetAttributes(AttrErrorCode.String(code))
		if code == chargeonce.EINTERNAL || code == chargeonce.EUNAVAILABLE {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
	}
	span.End()
}

func (s *tracedStore) KeyInsert(ctx context.Context, p chargeonce.KeyInsertParams) (chargeonce.KeyRecord, bool, error) {
	ctx, span := s.start(ctx, "KeyInsert", AttrMerchant.String(p.Charge.MerchantID), AttrChargeID.String(p.Charge.ID))
	rec, inserted, err := s.Store.KeyInsert(ctx, p)
	span.SetAttributes(AttrInserted.Bool(inserted))
	end(span, err)
	return rec, inserted, err
}

func (s *tracedStore) KeyGet(ctx context.Context, merchantID, key string) (chargeonce.KeyRecord, error) {
	ctx, span := s.start(ctx, "KeyGet", AttrMerchant.String(merchantID))
	rec, err := s.Store.KeyGet(ctx, merchantID, key)
	end(span, err)
	return rec, err
}

func (s *tracedStore) KeyComplete(ctx context.Context, p chargeonce.KeyCompleteParams) error {
	ctx, span := s.start(ctx, "KeyComplete", AttrMerchant.String(p.MerchantID), attribute.Int("http.response.status_code", p.ResponseStatus))
	err := s.Store.KeyComplete(ctx, p)
	end(span, err)
	return err
}

func (s *tracedStore) KeyRelease(ctx context.Context, merchantID, key, token string) error {
	ctx, span := s.start(ctx, "KeyRelease", AttrMerchant.String(merchantID))
	err := s.Store.KeyRelease(ctx, merchantID, key, token)
	end(span, err)
	return err
}

func (s *tracedStore) KeyLeaseSet(ctx context.Context, merchantID, key, token string, d time.Duration, recoveryAttempt bool) error {
	ctx, span := s.start(ctx, "KeyLeaseSet", AttrMerchant.String(merchantID))
	err := s.Store.KeyLeaseSet(ctx, merchantID, key, token, d, recoveryAttempt)
	end(span, err)
	return err
}

func (s *tracedStore) KeyClaim(ctx context.Context, merchantID, key, newToken string, lease time.Duration) (chargeonce.KeyRecord, bool, error) {
	ctx, span := s.start(ctx, "KeyClaim", AttrMerchant.String(merchantID))
	rec, claimed, err := s.Store.KeyClaim(ctx, merchantID, key, newToken, lease)
	span.SetAttributes(AttrClaimed.Bool(claimed))
	end(span, err)
	return rec, claimed, err
}

func (s *tracedStore) KeysClaimExpired(ctx context.Context, lease time.Duration, limit int) ([]chargeonce.KeyRecord, error) {
	ctx, span := s.start(ctx, "KeysClaimExpired")
	recs, err := s.Store.KeysClaimExpired(ctx, lease, limit)
	span.SetAttributes(AttrCount.Int(len(recs)))
	end(span, err)
	return recs, err
}

func (s *tracedStore) KeysDeleteExpired(ctx context.Context, limit int) (int, error) {
	ctx, span := s.start(ctx, "KeysDeleteExpired")
	n, err := s.Store.KeysDeleteExpired(ctx, limit)
	span.SetAttributes(AttrCount.Int(n))
	end(span, err)
	return n, err
}

func (s *tracedStore) KeysStuck(ctx context.Context) (chargeonce.StuckStats, error) {
	ctx, span := s.start(ctx, "KeysStuck")
	st, err := s.Store.KeysStuck(ctx)
	end(span, err)
	return st, err
}

func (s *tracedStore) ChargeGet(ctx context.Context, merchantID, id string) (chargeonce.Charge, error) {
	ctx, span := s.start(ctx, "ChargeGet", AttrMerchant.String(merchantID), AttrChargeID.String(id))
	c, err := s.Store.ChargeGet(ctx, merchantID, id)
	end(span, err)
	return c, err
}

func (s *tracedStore) ChargesListByOrder(ctx context.Context, merchantID string, orderID int64) ([]chargeonce.Charge, error) {
	ctx, span := s.start(ctx, "ChargesListByOrder", AttrMerchant.String(merchantID))
	cs, err := s.Store.ChargesListByOrder(ctx, merchantID, orderID)
	span.SetAttributes(AttrCount.Int(len(cs)))
	end(span, err)
	return cs, err
}

func (s *tracedStore) ChargesList(ctx context.Context, p chargeonce.ChargesListParams) (chargeonce.ChargesPage, error) {
	ctx, span := s.start(ctx, "ChargesList", AttrMerchant.String(p.MerchantID))
	page, err := s.Store.ChargesList(ctx, p)
	span.SetAttributes(AttrCount.Int(len(page.Charges)))
	end(span, err)
	return page, err
}

func (s *tracedStore) Ping(ctx context.Context) error {
	ctx, span := s.start(ctx, "Ping")
	err := s.Store.Ping(ctx)
	end(span, err)
	return err
}

func (s *tracedStore) KeyNotify(ctx context.Context, merchantID, key string) (bool, error) {
	ctx, span := s.start(ctx, "KeyNotify", AttrMerchant.String(merchantID))
	flagged, err := s.Store.KeyNotify(ctx, merchantID, key)
	end(span, err)
	return flagged, err
}

func (s *tracedStore) OutboxClaim(ctx context.Context, lease time.Duration, limit int) ([]chargeonce.OutboxEntry, error) {
	ctx, span := s.start(ctx, "OutboxClaim")
	es, err := s.Store.OutboxClaim(ctx, lease, limit)
	span.SetAttributes(AttrCount.Int(len(es)))
	end(span, err)
	return es, err
}

func (s *tracedStore) OutboxMarkSent(ctx context.Context, ids []int64) error {
	ctx, span := s.start(ctx, "OutboxMarkSent", AttrCount.Int(len(ids)))
	err := s.Store.OutboxMarkSent(ctx, ids)
	end(span, err)
	return err
}

func (s *tracedStore) OutboxStats(ctx context.Context) (chargeonce.OutboxStats, error) {
	ctx, span := s.start(ctx, "OutboxStats")
	st, err := s.Store.OutboxStats(ctx)
	end(span, err)
	return st, err
}
