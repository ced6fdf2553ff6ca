package sqlite

import (
	"context"
	"database/sql"
	"errors"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/internal/keyset"
)

// The statements on refunds.
const (
	// refundColumnsR are the columns refundRow reads, for a query that
	// names refunds "r".
	refundColumnsR = `r.id, r.merchant_id, r.idempotency_key, r.charge_id, r.amount_cents,
	r.currency, r.reason, r.metadata, r.status, r.failure_reason, r.created_at`

	sqlRefundInsert = `INSERT INTO refunds
	(id, merchant_id, idempotency_key, charge_id, amount_cents, currency, reason, metadata, status, created_at, updated_at)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, 'pending', ?9, ?9)`

	// sqlRefundAdd adds a new refund to its charge's refunded amount; the
	// WHERE clause and the CHECK on charges both refuse more than was
	// captured (the writer lock serializes it with every other refund).
	sqlRefundAdd = `UPDATE charges SET refunded_cents = refunded_cents + ?3
WHERE merchant_id = ?1 AND id = ?2 AND status = 'captured' AND refunded_cents + ?3 <= coalesce(captured_cents, amount_cents)
RETURNING id, merchant_id, idempotency_key, order_id, amount_cents,
	currency, payment_token, description, status, decline_code, created_at, metadata,
	capture_method, captured_cents`

	// sqlRefundComplete settles a pending refund; a failed or canceled one
	// gives its amount back to what its charge may still refund.
	sqlRefundComplete = `UPDATE refunds SET status = ?2, failure_reason = nullif(?3, ''), updated_at = ` + nowMicros + `
WHERE id = ?1 AND status = 'pending'
RETURNING charge_id, amount_cents`

	sqlRefundGiveBack = `UPDATE charges SET refunded_cents = refunded_cents - ?2 WHERE id = ?1`
)

// refundRow is the scan target of refundColumnsR, every column nullable
// (a charge's record joins no refund).
type refundRow struct {
	id, merchantID, key, chargeID, currency, reason, status, failure sql.NullString
	amount, createdAt                                                sql.NullInt64
	metadata                                                         map[string]string
}

func (r *refundRow) nullDest() []any {
	return []any{&r.id, &r.merchantID, &r.key, &r.chargeID, &r.amount,
		&r.currency, &r.reason, metadataColumn{&r.metadata}, &r.status, &r.failure, &r.createdAt}
}

func (r *refundRow) refundOrNil() *chargeonce.Refund {
	if !r.id.Valid {
		return nil
	}
	rf := r.refund()
	return &rf
}

func (r *refundRow) refund() chargeonce.Refund {
	return chargeonce.Refund{
		ID: r.id.String, MerchantID: r.merchantID.String, IdempotencyKey: r.key.String,
		ChargeID: r.chargeID.String, AmountCents: r.amount.Int64, Currency: r.currency.String,
		Reason: r.reason.String, Metadata: r.metadata, Status: chargeonce.RefundStatus(r.status.String),
		FailureReason: r.failure.String, CreatedAt: fromMicros(r.createdAt.Int64),
	}
}

// RefundInsert inserts the refund's record first (objectInsert), then
// (when it won) adds its amount to the charge's refunded amount and inserts
// the pending refund, in one transaction on the single writer: the refunds
// of one charge are serialized by it, and the guarded UPDATE (with the
// CHECK on charges behind it) refuses more refunded than captured, rolling
// the record back with it.
func (s *Store) RefundInsert(ctx context.Context, p chargeonce.RefundInsertParams) (chargeonce.KeyRecord, bool, error) {
	if err := p.CheckText(); err != nil {
		return chargeonce.KeyRecord{}, false, err
	}
	rf := p.Refund
	return s.objectInsert(ctx, "inserting refund", rf.MerchantID, rf.IdempotencyKey, rf.ID, p.Fingerprint, p.Token, p.Lease,
		func(ctx context.Context, tx *sql.Tx, q *queries, rec *chargeonce.KeyRecord, createdAt int64) error {
			// The charge's refunded amount, guarded: no row when the
			// charge is not captured or the sum would pass its amount (an
			// error rolls this write back to its savepoint, the key with it).
			amount := rf.AmountCents
			if amount == 0 {
				var remaining int64
				err := tx.QueryRowContext(ctx, `SELECT coalesce(captured_cents, amount_cents) - refunded_cents FROM charges WHERE merchant_id = ?1 AND id = ?2`,
					rf.MerchantID, rf.ChargeID).Scan(&remaining)
				if err != nil && !errors.Is(err, sql.ErrNoRows) {
					return wrap("reading the refunded charge", err)
				}
				amount = remaining
			}
			var cr chargeRow
			err := tx.StmtContext(ctx, q.refundAdd).QueryRowContext(ctx, rf.MerchantID, rf.ChargeID, amount).Scan(cr.dest()...)
			if errors.Is(err, sql.ErrNoRows) || amount <= 0 {
				return refusedRefund(ctx, tx, rf)
			}
			if err != nil {
				return wrap("adding to the charge's refunded amount", err)
			}
			if _, err := tx.StmtContext(ctx, q.refundInsert).ExecContext(ctx, rf.ID, rf.MerchantID, rf.IdempotencyKey, rf.ChargeID,
				amount, cr.c.Currency, rf.Reason, chargeonce.MetadataText(rf.Metadata), createdAt); err != nil {
				return wrap("inserting refund", err)
			}
			nr := rf
			nr.AmountCents, nr.Currency, nr.Status, nr.FailureReason, nr.CreatedAt = amount, cr.c.Currency, chargeonce.RefundPending, "", rec.CreatedAt
			rec.Charge, rec.Refund = cr.charge(), &nr
			return nil
		})
}

// refusedRefund says why no refund of rf could be added to its charge:
// ENOTFOUND, or chargeonce.RefundRefusal's answer; EREFUNDEXCEEDS naming
// what remains when the rule finds nothing to refuse (the guarded UPDATE,
// or the CHECK behind it, refused the sum).
func refusedRefund(ctx context.Context, tx *sql.Tx, rf chargeonce.Refund) error {
	var (
		status, currency string
		amount, refunded int64
	)
	err := tx.QueryRowContext(ctx, `SELECT status, coalesce(captured_cents, amount_cents), refunded_cents, currency FROM charges WHERE merchant_id = ?1 AND id = ?2`,
		rf.MerchantID, rf.ChargeID).Scan(&status, &amount, &refunded, &currency)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return chargeonce.Errorf(chargeonce.ENOTFOUND, "charge %q not found", rf.ChargeID)
	case err != nil:
		return wrap("reading the refunded charge", err)
	}
	if err := chargeonce.RefundRefusal(rf.ChargeID, rf.AmountCents, chargeonce.Status(status), amount-refunded, currency); err != nil {
		return err
	}
	return chargeonce.RefundExceeds(rf.ChargeID, rf.AmountCents, amount-refunded, currency)
}

// refundCompleteTx is KeyComplete's work for a refund's record inside tx.
func refundCompleteTx(ctx context.Context, tx *sql.Tx, q *queries, p chargeonce.KeyCompleteParams) error {
	if !p.RefundStatus.Final() {
		return chargeonce.Errorf(chargeonce.EINVALID, "a refund completes succeeded, failed or canceled, not %q", p.RefundStatus)
	}
	refundID, err := completeRecord(ctx, tx, q, p)
	if err != nil {
		return err
	}
	var chargeID string
	var amount int64
	err = tx.StmtContext(ctx, q.refundComplete).QueryRowContext(ctx, refundID, string(p.RefundStatus), p.FailureReason).Scan(&chargeID, &amount)
	if errors.Is(err, sql.ErrNoRows) {
		return nil // settled already (an operator's resolution): the record alone completes
	}
	if err != nil {
		return wrap("completing refund", err)
	}
	if p.RefundStatus.GivesBack() {
		if _, err := tx.ExecContext(ctx, sqlRefundGiveBack, chargeID, amount); err != nil {
			return wrap("giving a failed refund's amount back", err)
		}
	}
	return nil
}

// RefundGet returns the merchant's refund; another merchant's is ENOTFOUND.
func (s *Store) RefundGet(ctx context.Context, merchantID, id string) (chargeonce.Refund, error) {
	if !chargeonce.ValidText(merchantID) || !chargeonce.ValidText(id) {
		return chargeonce.Refund{}, chargeonce.Errorf(chargeonce.ENOTFOUND, "refund %q not found", id)
	}
	var r refundRow
	err := s.rdb.QueryRowContext(ctx, `SELECT `+refundColumnsR+` FROM refunds r WHERE r.merchant_id = ?1 AND r.id = ?2`,
		merchantID, id).Scan(r.nullDest()...)
	if errors.Is(err, sql.ErrNoRows) {
		return chargeonce.Refund{}, chargeonce.Errorf(chargeonce.ENOTFOUND, "refund %q not found", id)
	}
	if err != nil {
		return chargeonce.Refund{}, wrap("reading refund", err)
	}
	return r.refund(), nil
}

// RefundsList reads one page of the merchant's refunds, newest first, as a
// keyset range on one of the refunds indexes with a LIMIT.
func (s *Store) RefundsList(ctx context.Context, p chargeonce.RefundsListParams) (chargeonce.RefundsPage, error) {
	if err := p.Check(); err != nil {
		return chargeonce.RefundsPage{}, err
	}
	if !chargeonce.ValidText(p.MerchantID) || !chargeonce.ValidText(p.ChargeID) || !chargeonce.ValidText(p.StartingAfter) {
		return chargeonce.RefundsPage{Refunds: []chargeonce.Refund{}}, nil
	}
	var afterAt sql.NullInt64
	if p.StartingAfter != "" {
		err := s.rdb.QueryRowContext(ctx, `SELECT created_at FROM refunds WHERE merchant_id = ?1 AND id = ?2`,
			p.MerchantID, p.StartingAfter).Scan(&afterAt)
		if errors.Is(err, sql.ErrNoRows) {
			return chargeonce.RefundsPage{}, chargeonce.FieldError("starting_after", "starting_after %q is not one of this merchant's refunds", p.StartingAfter)
		}
		if err != nil {
			return chargeonce.RefundsPage{}, wrap("listing refunds", err)
		}
	}
	q, args := refundsPageSQL(p.MerchantID, p.ChargeID, afterAt.Int64, p.StartingAfter, p.Limit+1)
	rows, err := s.rdb.QueryContext(ctx, q, args...)
	if err != nil {
		return chargeonce.RefundsPage{}, wrap("listing refunds", err)
	}
	defer rows.Close()
	page := chargeonce.RefundsPage{Refunds: []chargeonce.Refund{}}
	for rows.Next() {
		var r refundRow
		if err := rows.Scan(r.nullDest()...); err != nil {
			return chargeonce.RefundsPage{}, wrap("listing refunds", err)
		}
		page.Refunds = append(page.Refunds, r.refund())
	}
	if err := rows.Err(); err != nil {
		return chargeonce.RefundsPage{}, wrap("listing refunds", err)
	}
	page.Refunds, page.HasMore = keyset.Trim(page.Refunds, p.Limit, false)
	return page, nil
}

// refundsPageSQL is a page of the merchant's refunds, newest first, and its
// arguments: see keyset.Where.
func refundsPageSQL(merchantID, chargeID string, at int64, cursor string, limit int) (string, []any) {
	where, args := keyset.Where("?", merchantID, chargeID, at, cursor, limit)
	return `SELECT ` + refundColumnsR + ` FROM refunds r WHERE ` + where + `
ORDER BY r.created_at DESC, r.id DESC LIMIT ?2`, args
}
