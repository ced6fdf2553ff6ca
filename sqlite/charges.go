package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/chargeonce/chargeonce"
)

// The statements on charges.
const (
	// chargeColumnsC are the columns chargeRow reads, for a query that
	// names charges "c".
	chargeColumnsC = `c.id, c.merchant_id, c.idempotency_key, c.order_id, c.amount_cents,
	c.currency, c.payment_token, c.description, c.status, c.decline_code, c.created_at, c.metadata,
	c.capture_method, c.captured_cents`

	// sqlChargeInsert inserts a new intent's processing charge; ?9 is the
	// record's created_at, so the charge and its record share one instant.
	sqlChargeInsert = `INSERT INTO charges
	(id, merchant_id, idempotency_key, order_id, amount_cents, currency,
	 payment_token, description, status, decline_code, created_at, updated_at, metadata)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, 'processing', NULL, ?9, ?9, ?10)`

	// sqlChargeInsertManual is sqlChargeInsert for a charge with manual
	// capture; automatic charges keep sqlChargeInsert as it was.
	sqlChargeInsertManual = `INSERT INTO charges
	(id, merchant_id, idempotency_key, order_id, amount_cents, currency,
	 payment_token, description, status, decline_code, created_at, updated_at, metadata, capture_method)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, 'processing', NULL, ?9, ?9, ?10, 'manual')`

	sqlChargeComplete = `UPDATE charges
SET status = ?2, decline_code = nullif(?3, ''), updated_at = ` + nowMicros + `
WHERE id = ?1`

	sqlChargeDelete = `DELETE FROM charges WHERE id = ?1`

	sqlChargeGet = `SELECT ` + chargeColumnsC + `
FROM charges c WHERE c.id = ?1 AND c.merchant_id = ?2`

	// sqlChargesByOrder lists newest first; rowid breaks ties between
	// charges created in the same millisecond, in insertion order.
	sqlChargesByOrder = `SELECT ` + chargeColumnsC + `
FROM charges c WHERE c.merchant_id = ?1 AND c.order_id = ?2
ORDER BY c.created_at DESC, c.rowid DESC`
)

// chargeRow is the scan target of chargeColumnsC.
type chargeRow struct {
	c           chargeonce.Charge
	status      string
	declineCode sql.NullString
	createdAt   int64
	method      sql.NullString
	captured    sql.NullInt64
}

func (r *chargeRow) dest() []any {
	return []any{
		&r.c.ID, &r.c.MerchantID, &r.c.IdempotencyKey, &r.c.OrderID, &r.c.AmountCents,
		&r.c.Currency, &r.c.PaymentToken, &r.c.Description, &r.status, &r.declineCode,
		&r.createdAt, metadataColumn{&r.c.Metadata}, &r.method, &r.captured,
	}
}

// metadataColumn scans the metadata column (chargeonce.MetadataText) into
// a charge's Metadata.
type metadataColumn struct{ m *map[string]string }

// Scan implements sql.Scanner.
func (c metadataColumn) Scan(src any) error {
	var s *string
	switch v := src.(type) {
	case nil:
	case string:
		s = &v
	case []byte:
		t := string(v)
		s = &t
	default:
		return fmt.Errorf("metadata column holds a %T", src)
	}
	m, err := chargeonce.ParseMetadataText(s)
	*c.m = m
	return err
}

func (r *chargeRow) charge() chargeonce.Charge {
	c := r.c
	c.Status = chargeonce.Status(r.status)
	c.DeclineCode = r.declineCode.String
	c.CreatedAt = fromMicros(r.createdAt)
	c.CaptureMethod = chargeonce.CaptureMethod(r.method.String)
	c.CapturedCents = r.captured.Int64
	return c
}

// ChargeGet returns the merchant's charge, or ENOTFOUND, also when the charge
// belongs to another merchant: no merchant can learn another's charge IDs.
func (s *Store) ChargeGet(ctx context.Context, merchantID, id string) (chargeonce.Charge, error) {
	if !chargeonce.ValidText(merchantID) || !chargeonce.ValidText(id) {
		return chargeonce.Charge{}, chargeonce.Errorf(chargeonce.ENOTFOUND, "charge %q not found", id)
	}
	q, err := s.prepared(ctx)
	if err != nil {
		return chargeonce.Charge{}, err
	}
	var r chargeRow
	err = q.chargeGet.QueryRowContext(ctx, id, merchantID).Scan(r.dest()...)
	if errors.Is(err, sql.ErrNoRows) {
		return chargeonce.Charge{}, chargeonce.Errorf(chargeonce.ENOTFOUND, "charge %q not found", id)
	}
	if err != nil {
		return chargeonce.Charge{}, wrap("reading charge", err)
	}
	return r.charge(), nil
}

// ChargesListByOrder returns the merchant's charges for an order, newest
// first; an empty, non-nil slice when there are none.
func (s *Store) ChargesListByOrder(ctx context.Context, merchantID string, orderID int64) ([]chargeonce.Charge, error) {
	if !chargeonce.ValidText(merchantID) {
		return []chargeonce.Charge{}, nil
	}
	q, err := s.prepared(ctx)
	if err != nil {
		return nil, err
	}
	rows, err := q.chargesByOrder.QueryContext(ctx, merchantID, orderID)
	if err != nil {
		return nil, wrap("listing charges by order", err)
	}
	defer rows.Close()
	charges := []chargeonce.Charge{}
	for rows.Next() {
		var r chargeRow
		if err := rows.Scan(r.dest()...); err != nil {
			return nil, wrap("listing charges by order", err)
		}
		charges = append(charges, r.charge())
	}
	if err := rows.Err(); err != nil {
		return nil, wrap("listing charges by order", err)
	}
	return charges, nil
}
