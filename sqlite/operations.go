package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/chargeonce/chargeonce"
)

// The statements on captures and cancels of authorizations.
const (
	// operationColumnsO are the columns operationRow reads, for a query
	// that names charge_operations "o".
	operationColumnsO = `o.id, o.kind, o.merchant_id, o.idempotency_key, o.charge_id, o.amount_cents,
	o.currency, o.status, o.failure_reason, o.created_at`

	// sqlOperationInsert inserts a pending capture or cancel. The partial
	// unique index charge_operations_one_live refuses a second one pending
	// or succeeded for the charge.
	sqlOperationInsert = `INSERT INTO charge_operations
	(id, merchant_id, idempotency_key, charge_id, kind, amount_cents, currency, status, created_at, updated_at)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 'pending', ?8, ?8)`

	// sqlOperationComplete settles a pending capture or cancel.
	sqlOperationComplete = `UPDATE charge_operations SET status = ?2, failure_reason = nullif(?3, ''), updated_at = ` + nowMicros + `
WHERE id = ?1 AND status = 'pending'
RETURNING charge_id, kind, amount_cents`

	// sqlOperationSettleCharge settles an authorized charge captured (with
	// the captured amount) or canceled; the trigger on charges records
	// charge.captured or charge.canceled.
	sqlOperationSettleCharge = `UPDATE charges
SET status = CASE ?2 WHEN 'capture' THEN 'captured' ELSE 'canceled' END,
	captured_cents = CASE ?2 WHEN 'capture' THEN ?3 END,
	updated_at = ` + nowMicros + `
WHERE id = ?1 AND status = 'authorized'`
)

// operationRow is the scan target of operationColumnsO, every column
// nullable (other records join no operation).
type operationRow struct {
	id, kind, merchantID, key, chargeID, currency, status, failure sql.NullString
	amount, createdAt                                              sql.NullInt64
}

func (r *operationRow) nullDest() []any {
	return []any{&r.id, &r.kind, &r.merchantID, &r.key, &r.chargeID, &r.amount,
		&r.currency, &r.status, &r.failure, &r.createdAt}
}

func (r *operationRow) operationOrNil() *chargeonce.Operation {
	if !r.id.Valid {
		return nil
	}
	return &chargeonce.Operation{
		ID: r.id.String, Kind: chargeonce.RecordKind(r.kind.String), MerchantID: r.merchantID.String,
		IdempotencyKey: r.key.String, ChargeID: r.chargeID.String, AmountCents: r.amount.Int64,
		Currency: r.currency.String, Status: chargeonce.OperationStatus(r.status.String),
		FailureReason: r.failure.String, CreatedAt: fromMicros(r.createdAt.Int64),
	}
}

// OperationInsert inserts the operation's record first (objectInsert),
// then (when it won, and the charge is authorized and the amount within
// it) the pending operation, in one transaction on the single writer:
// operations of one charge are serialized by it, and the partial unique
// index behind it keeps one pending or succeeded per charge. A refusal
// rolls the record back with it.
func (s *Store) OperationInsert(ctx context.Context, p chargeonce.OperationInsertParams) (chargeonce.KeyRecord, bool, error) {
	if err := p.CheckText(); err != nil {
		return chargeonce.KeyRecord{}, false, err
	}
	op := p.Operation
	if op.Kind == chargeonce.KindCancel {
		op.AmountCents = 0
	}
	return s.objectInsert(ctx, "inserting "+string(op.Kind), op.MerchantID, op.IdempotencyKey, op.ID, p.Fingerprint, p.Token, p.Lease,
		func(ctx context.Context, tx *sql.Tx, _ *queries, rec *chargeonce.KeyRecord, createdAt int64) error {
			var cr chargeRow
			err := tx.QueryRowContext(ctx, `SELECT `+chargeColumnsC+` FROM charges c WHERE c.merchant_id = ?1 AND c.id = ?2`,
				op.MerchantID, op.ChargeID).Scan(cr.dest()...)
			if errors.Is(err, sql.ErrNoRows) {
				return chargeonce.Errorf(chargeonce.ENOTFOUND, "charge %q not found", op.ChargeID)
			}
			if err != nil {
				return wrap("reading the charge of a "+string(op.Kind), err)
			}
			ch := cr.charge()
			var live sql.NullString
			if err := tx.QueryRowContext(ctx, `SELECT kind FROM charge_operations WHERE charge_id = ?1 AND status <> 'failed' LIMIT 1`,
				op.ChargeID).Scan(&live); err != nil && !errors.Is(err, sql.ErrNoRows) {
				return wrap("reading the operations of the charge", err)
			}
			if err := chargeonce.OperationRefusal(op.ChargeID, op.Kind, op.AmountCents, ch.Status, ch.AmountCents, ch.Currency, chargeonce.RecordKind(live.String)); err != nil {
				return err
			}
			amount := op.AmountCents
			if amount == 0 {
				amount = ch.AmountCents
			}
			if _, err := tx.ExecContext(ctx, sqlOperationInsert, op.ID, op.MerchantID, op.IdempotencyKey, op.ChargeID,
				string(op.Kind), amount, ch.Currency, createdAt); err != nil {
				return wrap("inserting "+string(op.Kind), err)
			}
			no := op
			no.AmountCents, no.Currency, no.Status, no.FailureReason, no.CreatedAt = amount, ch.Currency, chargeonce.OperationPending, "", rec.CreatedAt
			rec.Charge, rec.Operation = ch, &no
			return nil
		})
}

// objectInsert is the frame of RefundInsert and OperationInsert, in one
// transaction on the single writer: the record first (insertObjectKey), so
// that a replay or a key in flight is answered with its record whatever
// the charge's state now; then, for a record of the attempt's own, insert,
// the kind's statements, given the new record (its key, lease and creation
// time; createdAt in microseconds) to set its Charge and its refund or
// operation. An error of insert rolls the record back with it.
func (s *Store) objectInsert(ctx context.Context, what, merchantID, key, objectID, fingerprint, token string, lease time.Duration,
	insert func(ctx context.Context, tx *sql.Tx, q *queries, rec *chargeonce.KeyRecord, createdAt int64) error,
) (chargeonce.KeyRecord, bool, error) {
	q, err := s.prepared(ctx)
	if err != nil {
		return chargeonce.KeyRecord{}, false, err
	}
	var (
		rec      chargeonce.KeyRecord
		inserted bool
	)
	err = s.write(ctx, what, func(ctx context.Context, tx *sql.Tx) error {
		rec, inserted = chargeonce.KeyRecord{}, false
		createdAt, leaseUntil, leaseExpired, existing, err := insertObjectKey(ctx, tx, q, merchantID, key, objectID, fingerprint, token, lease)
		if err != nil || existing != nil {
			if existing != nil {
				rec = *existing
			}
			return err
		}
		rec = chargeonce.KeyRecord{
			MerchantID: merchantID, Key: key, Fingerprint: fingerprint, Token: token,
			State: chargeonce.KeyProcessing, LeaseUntil: fromMicros(leaseUntil), LeaseExpired: leaseExpired,
			LeaseHeld: true, CreatedAt: fromMicros(createdAt),
			LeaseRemaining: time.Duration(max(0, leaseUntil-createdAt)) * time.Microsecond,
		}
		if err := insert(ctx, tx, q, &rec, createdAt); err != nil {
			return err
		}
		inserted = true
		return nil
	})
	if err != nil {
		return chargeonce.KeyRecord{}, false, err
	}
	return rec, inserted, nil
}

// operationCompleteTx is KeyComplete's work for a capture's or a cancel's
// record inside tx: the record, the operation and (when it succeeded) the
// charge settle together.
func operationCompleteTx(ctx context.Context, tx *sql.Tx, q *queries, p chargeonce.KeyCompleteParams) error {
	if !p.OperationStatus.Final() {
		return chargeonce.Errorf(chargeonce.EINVALID, "a %s completes succeeded or failed, not %q", p.Kind, p.OperationStatus)
	}
	opID, err := completeRecord(ctx, tx, q, p)
	if err != nil {
		return err
	}
	var chargeID, kind string
	var amount int64
	err = tx.QueryRowContext(ctx, sqlOperationComplete, opID, string(p.OperationStatus), p.FailureReason).Scan(&chargeID, &kind, &amount)
	if errors.Is(err, sql.ErrNoRows) {
		return nil // settled already: the record alone completes
	}
	if err != nil {
		return wrap("completing "+string(p.Kind), err)
	}
	if p.OperationStatus == chargeonce.OperationSucceeded {
		if _, err := tx.ExecContext(ctx, sqlOperationSettleCharge, chargeID, kind, amount); err != nil {
			return wrap("settling the authorized charge", err)
		}
	}
	return nil
}

// AuthorizationsExpired lists authorizations older than p.TTL with no
// capture or cancel holding them and no failed cancel of the sweeper's, in
// (created_at, id) order after p.After, by the partial index on
// authorized charges and the partial indexes on charge_operations (the
// live ones, and the failed ones of 0024).
func (s *Store) AuthorizationsExpired(ctx context.Context, p chargeonce.AuthorizationsExpiredParams) ([]chargeonce.ExpiredAuthorization, error) {
	if p.Limit <= 0 {
		return nil, nil
	}
	q, args := sqlAuthorizationsExpired, []any{micros(p.TTL), p.Limit, chargeonce.ExpiryKeyPrefix}
	if p.After != nil {
		q, args = sqlAuthorizationsExpiredAfter, append(args, p.After.CreatedAt.UnixMicro(), p.After.ChargeID)
	}
	rows, err := s.rdb.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, wrap("listing expired authorizations", err)
	}
	defer rows.Close()
	var out []chargeonce.ExpiredAuthorization
	for rows.Next() {
		var (
			a  chargeonce.ExpiredAuthorization
			at int64
		)
		if err := rows.Scan(&a.MerchantID, &a.ChargeID, &at); err != nil {
			return nil, wrap("listing expired authorizations", err)
		}
		a.CreatedAt = fromMicros(at)
		out = append(out, a)
	}
	if err := rows.Err(); err != nil {
		return nil, wrap("listing expired authorizations", err)
	}
	return out, nil
}

// sqlAuthorizationsExpiredWhere is the filter of AuthorizationsExpired: ?1
// the TTL, ?3 the sweeper's key prefix.
const sqlAuthorizationsExpiredWhere = `
WHERE c.status = 'authorized' AND c.created_at <= ` + nowMicros + ` - ?1
	AND NOT EXISTS (SELECT 1 FROM charge_operations o WHERE o.charge_id = c.id AND o.status <> 'failed')
	AND NOT EXISTS (SELECT 1 FROM charge_operations o WHERE o.charge_id = c.id AND o.status = 'failed' AND o.idempotency_key = ?3 || c.id)`

const (
	sqlAuthorizationsExpired = `
SELECT c.merchant_id, c.id, c.created_at FROM charges c` + sqlAuthorizationsExpiredWhere + `
ORDER BY c.created_at, c.id
LIMIT ?2`
	sqlAuthorizationsExpiredAfter = `
SELECT c.merchant_id, c.id, c.created_at FROM charges c` + sqlAuthorizationsExpiredWhere + `
	AND (c.created_at, c.id) > (?4, ?5)
ORDER BY c.created_at, c.id
LIMIT ?2`
)

// insertObjectKey inserts, in tx, the idempotency record of a refund or an
// operation (objectID in its charge_id column) as KeyInsert does a
// charge's: a record that holds the key is returned as existing, one that
// expired is deleted and the key inserted again. For an inserted record it
// returns what the database set: its creation time, lease end and whether
// the lease has already ended (in microseconds of the database's clock).
func insertObjectKey(ctx context.Context, tx *sql.Tx, q *queries, merchantID, key, objectID, fingerprint, token string, lease time.Duration) (createdAt, leaseUntil int64, leaseExpired bool, existing *chargeonce.KeyRecord, err error) {
	insert := func() error {
		return tx.StmtContext(ctx, q.keyInsert).QueryRowContext(ctx,
			merchantID, key, fingerprint, token, micros(lease), objectID,
		).Scan(&createdAt, &leaseUntil, &leaseExpired)
	}
	err = insert()
	if errors.Is(err, sql.ErrNoRows) {
		rec, gone, rerr := scanKey(tx.StmtContext(ctx, q.keySelectW).QueryRowContext(ctx, merchantID, key))
		if rerr != nil {
			return 0, 0, false, nil, wrap("reading existing idempotency key", rerr)
		}
		if !gone {
			return 0, 0, false, &rec, nil
		}
		if _, derr := tx.StmtContext(ctx, q.keyDelete).ExecContext(ctx, merchantID, key); derr != nil {
			return 0, 0, false, nil, wrap("deleting expired idempotency key", derr)
		}
		err = insert()
	}
	if err != nil {
		return 0, 0, false, nil, wrap("inserting idempotency key", err)
	}
	return createdAt, leaseUntil, leaseExpired, nil, nil
}
