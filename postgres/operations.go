package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/chargeonce/chargeonce"
)

// operationColumns are a capture's or a cancel's columns (o: a
// charge_operations row, or NULLs when the record guards something else),
// read after refundColumns by scanAnyRecord. The age is the operation's, by
// the database's clock.
const operationColumns = `
	o.id, o.kind, o.merchant_id, o.idempotency_key, o.charge_id, o.amount_cents, o.currency,
	o.status, o.failure_reason, o.created_at,
	GREATEST(0, (EXTRACT(EPOCH FROM now() - o.created_at) * 1000000)::bigint)`

// keyInsertManualSQL is keyInsertSQL for a charge with manual capture: the
// same statement, its charge marked capture_method 'manual'. Automatic
// charges keep keyInsertSQL (and its batches) as they were.
var keyInsertManualSQL = func() string {
	r := strings.NewReplacer(
		"payment_token, description, status, metadata)", "payment_token, description, status, metadata, capture_method)",
		"'processing', $12 FROM k", "'processing', $12, 'manual' FROM k")
	q := r.Replace(keyInsertSQL)
	if strings.Count(q, "capture_method") != 1+strings.Count(keyInsertSQL, "capture_method") || !strings.Contains(q, "'manual' FROM k") {
		panic("postgres: keyInsertManualSQL: keyInsertSQL changed shape")
	}
	return q
}()

// operationRow is the scan target of operationColumns, every column
// nullable.
type operationRow struct {
	id, kind, merchant, key, chargeID, currency, status, failure *string
	amount, age                                                  *int64
	created                                                      *time.Time
}

func (r *operationRow) dest() []any {
	return []any{&r.id, &r.kind, &r.merchant, &r.key, &r.chargeID, &r.amount, &r.currency,
		&r.status, &r.failure, &r.created, &r.age}
}

func (r *operationRow) operation() *chargeonce.Operation {
	op := &chargeonce.Operation{
		ID: *r.id, Kind: chargeonce.RecordKind(*r.kind), MerchantID: *r.merchant, IdempotencyKey: *r.key,
		ChargeID: *r.chargeID, AmountCents: *r.amount, Currency: *r.currency,
		Status: chargeonce.OperationStatus(*r.status), CreatedAt: *r.created,
	}
	if r.failure != nil {
		op.FailureReason = *r.failure
	}
	return op
}

// operationInsertSQL inserts a capture's or a cancel's record and its
// pending operation in one statement, first: the record commits before the
// acquirer is called.
//
// The database decides between operations of one charge: the partial
// unique index charge_operations_one_live admits one pending or succeeded
// operation per charge, so of concurrent captures and cancels (whatever
// their keys) exactly one inserts, and the others' statements fail with a
// unique violation, whole (nothing written). No operation is inserted for
// a charge that is not authorized, nor for a capture past the authorized
// amount (au is empty), and none when the key is taken: the second branch
// then reads the record that holds it, of whatever kind.
//
// The charge is read by its id alone, as in refundInsertSQL (a partial
// index on authorized charges, or the merchant's status index, would
// otherwise be walked).
//
// $8 = 0 captures (or, for a cancel, releases) the whole authorized amount.
const operationInsertSQL = `
WITH ch AS MATERIALIZED (
	SELECT id, merchant_id, status, currency, amount_cents FROM charges WHERE id = $7
), au AS (
	SELECT id, currency, amount_cents FROM ch
	WHERE merchant_id = $1 AND status = 'authorized' AND $8::bigint <= amount_cents
), ` + objectKeyInsert + `au` + objectKeyInsertEnd + `, o AS (
	INSERT INTO charge_operations
		(id, merchant_id, idempotency_key, charge_id, kind, amount_cents, currency, status)
	SELECT $6, $1, $2, $7, $9, CASE WHEN $8::bigint = 0 THEN au.amount_cents ELSE $8::bigint END,
		au.currency, 'pending'
	FROM k, au
	RETURNING *
)
SELECT true, ` + refundColumns + `, ` + operationColumns + `, ` + recordColumns + `
FROM k JOIN o ON o.id = k.charge_id JOIN charges c ON c.id = o.charge_id
	LEFT JOIN refunds r ON false` + anyRecordUnlessInserted

// OperationInsert writes the capture or cancel first and lets the database
// refuse: see operationInsertSQL and chargeonce.Operations.
func (s *Store) OperationInsert(ctx context.Context, p chargeonce.OperationInsertParams) (chargeonce.KeyRecord, bool, error) {
	if err := p.CheckText(); err != nil {
		return chargeonce.KeyRecord{}, false, err
	}
	op := p.Operation
	if op.Kind == chargeonce.KindCancel {
		op.AmountCents = 0 // a void releases the whole authorization
	}
	return s.insertLoop(ctx, insertKind{
		what: "inserting " + string(op.Kind), merchantID: op.MerchantID, key: op.IdempotencyKey, token: p.Token,
		refusal: func(err error) (error, bool) {
			// A unique violation: another operation holds the charge (nil
			// when it failed since); no row: the charge is not authorized
			// or the amount exceeds it, or the key was held by a record
			// the snapshot could not see, gone again.
			if isUniqueViolation(err) || errors.Is(err, pgx.ErrNoRows) {
				return s.operationRefused(ctx, op), true
			}
			return nil, false
		},
	}, func() (rec chargeonce.KeyRecord, inserted, expired bool, err error) {
		rec, expired, err = scanAnyRecord(s.pool.QueryRow(ctx, operationInsertSQL,
			op.MerchantID, op.IdempotencyKey, p.Fingerprint, p.Token, p.Lease, op.ID,
			op.ChargeID, op.AmountCents, string(op.Kind),
		), &inserted)
		return rec, inserted, expired, err
	})
}

// isUniqueViolation reports SQLSTATE 23505: here, another capture or
// cancel of the charge holding charge_operations_one_live.
func isUniqueViolation(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23505"
}

// operationRefused says why no operation op could be inserted: ENOTFOUND,
// or chargeonce.OperationRefusal's answer; nil when nothing refuses it now
// (a record the insert's snapshot could not see held the key, and is gone
// again).
func (s *Store) operationRefused(ctx context.Context, op chargeonce.Operation) error {
	var (
		status, currency, live string
		amount                 int64
		owner                  string
	)
	err := s.pool.QueryRow(ctx, `
SELECT c.status, c.amount_cents, c.currency,
	COALESCE((SELECT o.kind FROM charge_operations o WHERE o.charge_id = c.id AND o.status <> 'failed' LIMIT 1), ''),
	c.merchant_id
FROM charges c WHERE c.id = $1`, // byID
		op.ChargeID).Scan(&status, &amount, &currency, &live, &owner)
	switch {
	case notTheirs(err, owner, op.MerchantID):
		return chargeonce.Errorf(chargeonce.ENOTFOUND, "charge %q not found", op.ChargeID)
	case err != nil:
		return fmt.Errorf("reading the charge of a %s: %w", op.Kind, translate(err))
	}
	return chargeonce.OperationRefusal(op.ChargeID, op.Kind, op.AmountCents, chargeonce.Status(status), amount, currency, chargeonce.RecordKind(live))
}

// operationCompleteSQL settles a capture's or a cancel's record as a
// compare-and-set on the owner's token, like keyCompleteSQL: the record
// completes (expiring $8 from now), the operation takes its final status,
// and a succeeded one settles its charge captured (with the captured
// amount) or canceled, all in one statement, whose charge update is what
// records the charge.captured or charge.canceled event (the trigger of
// migration 0017). The status it settles, authorized, comes from o rather
// than a constant, so that the charge is found by its id: a constant would
// let PostgreSQL walk the partial index of every authorized charge instead
// (TestRefundsAndCapturesReadTheirChargeByID).
const operationCompleteSQL = keyCompleteCTE + `, o AS (
	UPDATE charge_operations
	SET status = $6, failure_reason = NULLIF($7, ''), updated_at = now()
	FROM k WHERE charge_operations.id = k.charge_id AND charge_operations.status = 'pending'
	RETURNING charge_operations.charge_id, charge_operations.kind, charge_operations.amount_cents,
		'authorized'::text AS settles
), c AS (
	UPDATE charges
	SET status = CASE o.kind WHEN 'capture' THEN 'captured' ELSE 'canceled' END,
		captured_cents = CASE o.kind WHEN 'capture' THEN o.amount_cents END,
		updated_at = now()
	FROM o WHERE charges.id = o.charge_id AND $6 = 'succeeded' AND charges.status = o.settles
)
SELECT count(*) FROM k`

func (s *Store) operationComplete(ctx context.Context, p chargeonce.KeyCompleteParams) error {
	if !p.OperationStatus.Final() {
		return chargeonce.Errorf(chargeonce.EINVALID, "a %s completes succeeded or failed, not %q", p.Kind, p.OperationStatus)
	}
	var n int
	err := s.pool.QueryRow(ctx, operationCompleteSQL,
		p.MerchantID, p.Key, p.Token, p.ResponseStatus, p.ResponseBody, string(p.OperationStatus), p.FailureReason, p.TTL, stateProcessing,
	).Scan(&n)
	if err != nil {
		return fmt.Errorf("completing %s: %w", p.Kind, translate(err))
	}
	if n == 0 {
		return staleErr(p.Key)
	}
	return nil
}

// AuthorizationsExpired lists authorizations older than p.TTL with no
// capture or cancel holding them and no failed cancel of the sweeper's, in
// (created_at, id) order after p.After, by the partial index on
// authorized charges (it holds no automatic charge); each one's operations
// are found by the partial indexes on charge_operations (the live ones,
// and the failed ones of 0024). The page after a cursor is a statement of
// its own, so that neither shape's plan is a generic one for both.
func (s *Store) AuthorizationsExpired(ctx context.Context, p chargeonce.AuthorizationsExpiredParams) ([]chargeonce.ExpiredAuthorization, error) {
	if p.Limit <= 0 {
		return nil, nil
	}
	q, args := authorizationsExpiredSQL, []any{p.TTL, p.Limit, chargeonce.ExpiryKeyPrefix}
	if p.After != nil {
		q, args = authorizationsExpiredAfterSQL, append(args, p.After.CreatedAt, p.After.ChargeID)
	}
	rows, err := s.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("listing expired authorizations: %w", translate(err))
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[chargeonce.ExpiredAuthorization])
	if err != nil {
		return nil, fmt.Errorf("listing expired authorizations: %w", translate(err))
	}
	return out, nil
}

// authorizationsExpiredWhere is the filter of AuthorizationsExpired: $1 the
// TTL, $3 the sweeper's key prefix.
const authorizationsExpiredWhere = `
WHERE c.status = 'authorized' AND c.created_at <= now() - $1::interval
	AND NOT EXISTS (SELECT FROM charge_operations o WHERE o.charge_id = c.id AND o.status <> 'failed')
	AND NOT EXISTS (SELECT FROM charge_operations o WHERE o.charge_id = c.id AND o.status = 'failed' AND o.idempotency_key = $3 || c.id)`

const (
	authorizationsExpiredSQL = `
SELECT c.merchant_id, c.id, c.created_at FROM charges c` + authorizationsExpiredWhere + `
ORDER BY c.created_at, c.id
LIMIT $2`
	authorizationsExpiredAfterSQL = `
SELECT c.merchant_id, c.id, c.created_at FROM charges c` + authorizationsExpiredWhere + `
	AND (c.created_at, c.id) > ($4, $5)
ORDER BY c.created_at, c.id
LIMIT $2`
)
