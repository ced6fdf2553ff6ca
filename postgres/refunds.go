package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/internal/keyset"
)

// refundColumns are a refund's columns (r: a refunds row, or NULLs when
// the record is a charge's), read before recordColumns by scanAnyRecord.
// The age is the refund's, by the database's clock.
const refundColumns = `
	r.id, r.merchant_id, r.idempotency_key, r.charge_id, r.amount_cents, r.currency,
	r.reason, r.metadata, r.status, r.failure_reason, r.created_at,
	GREATEST(0, (EXTRACT(EPOCH FROM now() - r.created_at) * 1000000)::bigint)`

// anyRecordFrom joins records (k) of either kind to what they guard: a
// refund's record to its refund (r) and the refunded charge (c), a
// charge's to its charge (c, r all NULL).
const anyRecordFrom = `
	LEFT JOIN refunds r ON r.id = k.charge_id
	LEFT JOIN charge_operations o ON o.id = k.charge_id
	JOIN charges c ON c.id = COALESCE(r.charge_id, o.charge_id, k.charge_id)`

// anyRecordGetSQL reads a record of either kind.
const anyRecordGetSQL = `
SELECT ` + refundColumns + `, ` + operationColumns + `, ` + recordColumns + `
FROM idempotency_keys k` + anyRecordFrom + `
WHERE k.merchant_id = $1 AND k.key = $2`

// objectKeyInsert and objectKeyInsertEnd, around the name of a CTE, are
// the k of refundInsertSQL and operationInsertSQL: the record of a refund
// or an operation ($1 to $6: merchant, key, fingerprint, token, lease, and
// the object's id in charge_id), inserted when that CTE holds the charge
// (it admits the object) and the key is free.
const (
	objectKeyInsert = `k AS (
	INSERT INTO idempotency_keys
		(merchant_id, key, fingerprint, token, state, lease_until, charge_id)
	SELECT $1, $2, $3, $4, 'processing', now() + $5::interval, $6 FROM `
	objectKeyInsertEnd = `
	ON CONFLICT (merchant_id, key) DO NOTHING
	RETURNING *
)`
)

// anyRecordUnlessInserted ends refundInsertSQL and operationInsertSQL: the
// record of either kind that holds the key, when k inserted none.
const anyRecordUnlessInserted = `
UNION ALL
SELECT false, ` + refundColumns + `, ` + operationColumns + `, ` + recordColumns + `
FROM idempotency_keys k` + anyRecordFrom + `
WHERE k.merchant_id = $1 AND k.key = $2 AND NOT EXISTS (SELECT FROM k)`

// scanAnyRecord scans refundColumns, operationColumns then recordColumns,
// optionally preceded by extra columns.
func scanAnyRecord(row pgx.Row, extra ...any) (chargeonce.KeyRecord, bool, error) {
	var (
		id, merchant, key, chargeID, currency, reason, status *string
		amount, age                                           *int64
		metadata, failure                                     *string
		created                                               *time.Time
		op                                                    operationRow
	)
	extra = append(extra, &id, &merchant, &key, &chargeID, &amount, &currency,
		&reason, &metadata, &status, &failure, &created, &age)
	extra = append(extra, op.dest()...)
	rec, expired, err := scanRecord(row, extra...)
	if err == nil && op.id != nil {
		rec.Operation = op.operation()
		rec.Age = time.Duration(*op.age) * time.Microsecond
	}
	if err != nil || id == nil {
		return rec, expired, err
	}
	rf := &chargeonce.Refund{
		ID: *id, MerchantID: *merchant, IdempotencyKey: *key, ChargeID: *chargeID,
		AmountCents: *amount, Currency: *currency, Reason: *reason,
		Status: chargeonce.RefundStatus(*status), CreatedAt: *created,
	}
	if failure != nil {
		rf.FailureReason = *failure
	}
	if rf.Metadata, err = chargeonce.ParseMetadataText(metadata); err != nil {
		return chargeonce.KeyRecord{}, false, err
	}
	rec.Refund = rf
	rec.Age = time.Duration(*age) * time.Microsecond
	return rec, expired, nil
}

// refundInsertSQL inserts a refund's record and its pending refund, and
// adds the refund's amount to the charge's refunded_cents, in one
// statement, first: the record commits before the acquirer is called.
//
// The charge's row lock, taken by the UPDATE, serializes concurrent
// refunds of one charge; the UPDATE re-reads the row as the previous
// refund committed it, and charges_refunded_cents_check refuses a sum past
// the captured amount, which aborts the whole statement (nothing written).
// No refund is inserted for a charge that is not captured, nor for one
// whose remaining amount, as the snapshot sees it, is short of the refund
// (cap is empty): only a refund racing another one reaches the CHECK, so
// a plain over-refund does not abort the group commit's transaction it
// runs in (runBatch). None is inserted either when the key is taken: the
// second branch then reads the record that holds it (of either kind), as
// keyInsertSQL does.
//
// The charge is read by its id alone, in a MATERIALIZED CTE that keeps the
// merchant's and the status's conditions out of the scan: with all three
// in one WHERE PostgreSQL may pick charges_merchant_status_created_idx
// over the primary key and walk every captured charge of the merchant
// (TestRefundsAndCapturesReadTheirChargeByID).
//
// $8 = 0 refunds what remained when the statement's snapshot was taken; a
// refund committed since makes the sum exceed, and the attempt is told
// what remains now.
const refundInsertSQL = `
WITH ch AS MATERIALIZED (
	SELECT id, merchant_id, status, currency, COALESCE(captured_cents, amount_cents) - refunded_cents AS remaining
	FROM charges WHERE id = $7
), cap AS (
	SELECT id, currency, remaining FROM ch
	WHERE merchant_id = $1 AND status = 'captured' AND remaining >= GREATEST($8::bigint, 1)
), ` + objectKeyInsert + `cap` + objectKeyInsertEnd + `, u AS (
	UPDATE charges
	SET refunded_cents = charges.refunded_cents + CASE WHEN $8::bigint = 0 THEN cap.remaining ELSE $8::bigint END
	FROM k, cap WHERE charges.id = cap.id
	RETURNING charges.id
), r AS (
	INSERT INTO refunds
		(id, merchant_id, idempotency_key, charge_id, amount_cents, currency, reason, metadata, status)
	SELECT $6, $1, $2, $7, CASE WHEN $8::bigint = 0 THEN cap.remaining ELSE $8::bigint END,
		cap.currency, $9, $10, 'pending'
	FROM k, cap
	RETURNING *
)
SELECT true, ` + refundColumns + `, ` + operationColumns + `, ` + recordColumns + `
FROM k JOIN r ON r.id = k.charge_id JOIN charges c ON c.id = r.charge_id
	LEFT JOIN charge_operations o ON false` + anyRecordUnlessInserted

// RefundInsert writes the refund first and lets the database refuse: see
// refundInsertSQL and chargeonce.Refunds.
func (s *Store) RefundInsert(ctx context.Context, p chargeonce.RefundInsertParams) (chargeonce.KeyRecord, bool, error) {
	if err := p.CheckText(); err != nil {
		return chargeonce.KeyRecord{}, false, err
	}
	rf := p.Refund
	return s.insertLoop(ctx, insertKind{
		what: "inserting refund", merchantID: rf.MerchantID, key: rf.IdempotencyKey, token: p.Token,
		refusal: func(err error) (error, bool) {
			switch {
			case isCheckViolation(err):
				return s.refundRefused(ctx, rf), true
			case errors.Is(err, pgx.ErrNoRows):
				// The charge is not refundable, or the key was held by a
				// record the snapshot could not see, gone again.
				return s.refundable(ctx, rf), true
			}
			return nil, false
		},
	}, func() (chargeonce.KeyRecord, bool, bool, error) { return s.refundInsertRound(ctx, p) })
}

// refundInsertRound runs one round of RefundInsert's insert: in a batch
// with concurrent attempts (group commit: batch.go), or alone. pgx.ErrNoRows
// means no record was inserted nor seen; a CHECK violation, a refund
// racing another past the captured amount.
func (s *Store) refundInsertRound(ctx context.Context, p chargeonce.RefundInsertParams) (rec chargeonce.KeyRecord, inserted, expired bool, err error) {
	if s.batches == nil {
		return s.refundInsertOne(ctx, p)
	}
	j := &refundInsertJob{jobState: jobState{ctx: ctx}, p: p}
	if err := s.batches.do(j); err != nil {
		return chargeonce.KeyRecord{}, false, false, err
	}
	return j.rec, j.inserted, j.expired, j.err
}

// refundInsertOne is one round of RefundInsert's insert as a single
// statement.
func (s *Store) refundInsertOne(ctx context.Context, p chargeonce.RefundInsertParams) (rec chargeonce.KeyRecord, inserted, expired bool, err error) {
	rec, expired, err = scanAnyRecord(s.pool.QueryRow(ctx, refundInsertSQL, refundInsertArgs(p)...), &inserted)
	if err == nil && !inserted && rec.Token == p.Token {
		// Our own record: a batch this attempt was in committed it before
		// failing, and this retry of the insert found it.
		inserted = true
	}
	return rec, inserted, expired, err
}

// refundInsertArgs are refundInsertSQL's arguments for p.
func refundInsertArgs(p chargeonce.RefundInsertParams) []any {
	rf := p.Refund
	return []any{rf.MerchantID, rf.IdempotencyKey, p.Fingerprint, p.Token, p.Lease, rf.ID,
		rf.ChargeID, rf.AmountCents, rf.Reason, chargeonce.MetadataText(rf.Metadata)}
}

// isCheckViolation reports a CHECK constraint refusing a refund: the sum
// past the captured amount, or nothing left to refund.
func isCheckViolation(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23514"
}

// refundRefused builds the answer to a refund the database refused:
// EREFUNDEXCEEDS naming what remains now.
func (s *Store) refundRefused(ctx context.Context, rf chargeonce.Refund) error {
	remaining, currency, _, err := s.refundedCharge(ctx, rf)
	if err != nil {
		return err
	}
	return chargeonce.RefundExceeds(rf.ChargeID, rf.AmountCents, remaining, currency)
}

// refundable returns why no refund rf can be inserted for its charge:
// ENOTFOUND, or chargeonce.RefundRefusal's answer; nil when it could be.
func (s *Store) refundable(ctx context.Context, rf chargeonce.Refund) error {
	remaining, currency, status, err := s.refundedCharge(ctx, rf)
	if err != nil {
		return err
	}
	return chargeonce.RefundRefusal(rf.ChargeID, rf.AmountCents, status, remaining, currency)
}

// refundedCharge reads what rf's charge may still refund, its currency and
// its status; ENOTFOUND when the merchant has no such charge.
func (s *Store) refundedCharge(ctx context.Context, rf chargeonce.Refund) (remaining int64, currency string, status chargeonce.Status, err error) {
	var owner string
	err = s.pool.QueryRow(ctx, `SELECT COALESCE(captured_cents, amount_cents) - refunded_cents, currency, status, merchant_id FROM charges WHERE id = $1`,
		rf.ChargeID).Scan(&remaining, &currency, &status, &owner) // byID
	if notTheirs(err, owner, rf.MerchantID) {
		return 0, "", "", chargeonce.Errorf(chargeonce.ENOTFOUND, "charge %q not found", rf.ChargeID)
	}
	if err != nil {
		return 0, "", "", fmt.Errorf("reading the refunded charge: %w", translate(err))
	}
	return remaining, currency, status, nil
}

// refundSettleCTE settles a refund's record as a compare-and-set on the
// owner's token, like keyCompleteSQL: the record completes (expiring $8
// from now) and the refund takes its final status.
const refundSettleCTE = keyCompleteCTE + `, r AS (
	UPDATE refunds
	SET status = $6, failure_reason = NULLIF($7, ''), updated_at = now()
	FROM k WHERE refunds.id = k.charge_id AND refunds.status = 'pending'
	RETURNING refunds.charge_id, refunds.amount_cents
)`

// refundCompleteSQL is refundSettleCTE, and a failed or canceled refund
// gives its amount back to what the charge may still refund, all in one
// statement.
const refundCompleteSQL = refundSettleCTE + `, c AS (
	UPDATE charges SET refunded_cents = charges.refunded_cents - r.amount_cents
	FROM r WHERE charges.id = r.charge_id AND $6 IN ('failed', 'canceled')
)
SELECT count(*) FROM k`

// refundSucceedSQL is refundCompleteSQL for a refund that gives nothing
// back: it does not touch charges at all. An UPDATE of no row still fires
// the statement triggers on charges (the settlement events' and, through
// its INSERT of no event, the fan-out's), about 37 µs of PostgreSQL's time
// a statement (docs/performance.md).
const refundSucceedSQL = refundSettleCTE + `
SELECT count(*) FROM k`

// refundCompleteStatement is the statement that completes a refund
// ending in status.
func refundCompleteStatement(status chargeonce.RefundStatus) string {
	if status.GivesBack() {
		return refundCompleteSQL
	}
	return refundSucceedSQL
}

func (s *Store) refundComplete(ctx context.Context, p chargeonce.KeyCompleteParams) error {
	if !p.RefundStatus.Final() {
		return chargeonce.Errorf(chargeonce.EINVALID, "a refund completes succeeded, failed or canceled, not %q", p.RefundStatus)
	}
	if s.batches == nil {
		return s.refundCompleteOne(ctx, p, false)
	}
	j := &completeJob{jobState: jobState{ctx: ctx}, p: p}
	if err := s.batches.do(j); err != nil {
		return fmt.Errorf("completing refund: %w", translate(err))
	}
	return j.err
}

// refundCompleteOne is refundComplete as a single statement; retry as for
// completeOne.
func (s *Store) refundCompleteOne(ctx context.Context, p chargeonce.KeyCompleteParams, retry bool) error {
	var n int
	if err := s.pool.QueryRow(ctx, refundCompleteStatement(p.RefundStatus), refundCompleteArgs(p)...).Scan(&n); err != nil {
		return fmt.Errorf("completing refund: %w", translate(err))
	}
	if n == 0 {
		return s.lostCompletion(ctx, p, retry)
	}
	return nil
}

// refundCompleteArgs are refundCompleteSQL's arguments for p.
func refundCompleteArgs(p chargeonce.KeyCompleteParams) []any {
	return []any{p.MerchantID, p.Key, p.Token, p.ResponseStatus, p.ResponseBody, string(p.RefundStatus), p.FailureReason, p.TTL, stateProcessing}
}

const refundSelect = `SELECT r.id, r.merchant_id, r.idempotency_key, r.charge_id, r.amount_cents, r.currency,
	r.reason, r.metadata, r.status, r.failure_reason, r.created_at FROM refunds r`

func scanRefund(row pgx.Row) (chargeonce.Refund, error) {
	var (
		rf       chargeonce.Refund
		status   string
		metadata *string
		failure  *string
	)
	if err := row.Scan(&rf.ID, &rf.MerchantID, &rf.IdempotencyKey, &rf.ChargeID, &rf.AmountCents, &rf.Currency,
		&rf.Reason, &metadata, &status, &failure, &rf.CreatedAt); err != nil {
		return chargeonce.Refund{}, err
	}
	rf.Status = chargeonce.RefundStatus(status)
	if failure != nil {
		rf.FailureReason = *failure
	}
	var err error
	rf.Metadata, err = chargeonce.ParseMetadataText(metadata)
	return rf, err
}

// RefundGet returns the merchant's refund; another merchant's is ENOTFOUND.
func (s *Store) RefundGet(ctx context.Context, merchantID, id string) (chargeonce.Refund, error) {
	if !chargeonce.ValidText(merchantID) || !chargeonce.ValidText(id) {
		return chargeonce.Refund{}, chargeonce.Errorf(chargeonce.ENOTFOUND, "refund %q not found", id)
	}
	rf, err := scanRefund(s.pool.QueryRow(ctx, refundSelect+` WHERE r.id = $1`, id)) // byID
	if notTheirs(err, rf.MerchantID, merchantID) {
		return chargeonce.Refund{}, chargeonce.Errorf(chargeonce.ENOTFOUND, "refund %q not found", id)
	}
	if err != nil {
		return chargeonce.Refund{}, fmt.Errorf("reading refund: %w", translate(err))
	}
	return rf, nil
}

// RefundsList reads one page of the merchant's refunds, newest first, as
// a keyset range on one of the refunds indexes with a LIMIT.
func (s *Store) RefundsList(ctx context.Context, p chargeonce.RefundsListParams) (chargeonce.RefundsPage, error) {
	if err := p.Check(); err != nil {
		return chargeonce.RefundsPage{}, err
	}
	if !chargeonce.ValidText(p.MerchantID) || !chargeonce.ValidText(p.ChargeID) || !chargeonce.ValidText(p.StartingAfter) {
		return chargeonce.RefundsPage{Refunds: []chargeonce.Refund{}}, nil
	}
	var (
		afterAt time.Time
		afterID string
	)
	if p.StartingAfter != "" {
		var owner string
		err := s.pool.QueryRow(ctx, `SELECT created_at, id, merchant_id FROM refunds WHERE id = $1`,
			p.StartingAfter).Scan(&afterAt, &afterID, &owner) // byID
		if notTheirs(err, owner, p.MerchantID) {
			return chargeonce.RefundsPage{}, chargeonce.FieldError("starting_after", "starting_after %q is not one of this merchant's refunds", p.StartingAfter)
		}
		if err != nil {
			return chargeonce.RefundsPage{}, fmt.Errorf("listing refunds: %w", translate(err))
		}
	}
	where, args := keyset.Where("$", p.MerchantID, p.ChargeID, afterAt, afterID, p.Limit+1)
	rows, err := s.pool.Query(ctx, refundSelect+` WHERE `+where+`
ORDER BY created_at DESC, id DESC LIMIT $2`, args...)
	if err != nil {
		return chargeonce.RefundsPage{}, fmt.Errorf("listing refunds: %w", translate(err))
	}
	page, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (chargeonce.Refund, error) { return scanRefund(row) })
	if err != nil {
		return chargeonce.RefundsPage{}, fmt.Errorf("listing refunds: %w", translate(err))
	}
	out := chargeonce.RefundsPage{}
	out.Refunds, out.HasMore = keyset.Trim(page, p.Limit, false)
	return out, nil
}
