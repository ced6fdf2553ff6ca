package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/chargeonce/chargeonce"
)

// OperationsListByChargeReference returns one page of the captures and
// cancels of authorizations, pending or succeeded, last changed in
// [p.From, p.To), in charge id order, after p.AfterCharge.
//
// It walks the partial unique index charge_operations_one_live (migration
// 0017: one pending or succeeded operation per charge, so the charge id
// alone is the cursor) from the cursor (or p.ChargeMin), below p.ChargeMax
// when given, and filters on updated_at, the time an operation settled: no
// index is added for reconciliation. A run reads the index once, proportional to the
// manual charges up to the period's end rather than to the period's own.
func (s *Store) OperationsListByChargeReference(ctx context.Context, p chargeonce.ReconOperationsParams) ([]chargeonce.ReconOperation, error) {
	if p.Limit <= 0 || p.Limit > chargeonce.ReconMaxPage {
		return nil, chargeonce.FieldError("limit", "limit must be 1 to %d; got %d", chargeonce.ReconMaxPage, p.Limit)
	}
	if !chargeonce.ValidText(p.AfterCharge) || !chargeonce.ValidText(p.ChargeMax) || !chargeonce.ValidText(p.ChargeMin) {
		return nil, chargeonce.FieldError("after", "the cursor and bounds must be valid UTF-8 without U+0000")
	}
	// Each bound is its own statement text rather than ($5 = '' OR ...), so
	// that a generic plan still starts and stops the index's range scan at
	// ChargeMin and ChargeMax.
	q, args := operationsByChargeSQL, []any{p.AfterCharge, p.From, p.To, p.Limit}
	if p.ChargeMax != "" {
		args = append(args, p.ChargeMax)
		q += fmt.Sprintf(" AND o.charge_id < $%d", len(args))
	}
	if p.ChargeMin != "" {
		args = append(args, p.ChargeMin)
		q += fmt.Sprintf(" AND o.charge_id >= $%d", len(args))
	}
	q += `
ORDER BY o.charge_id LIMIT $4`
	rows, err := s.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("listing operations by charge reference: %w", translate(err))
	}
	ops, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (chargeonce.ReconOperation, error) {
		var (
			r       operationRow
			settled = new(chargeonce.ReconOperation)
		)
		if err := row.Scan(append(r.dest(), &settled.SettledAt)...); err != nil {
			return chargeonce.ReconOperation{}, err
		}
		settled.Operation = *r.operation()
		settled.CreatedAt, settled.SettledAt = settled.CreatedAt.UTC(), settled.SettledAt.UTC()
		return *settled, nil
	})
	if err != nil {
		return nil, fmt.Errorf("listing operations by charge reference: %w", translate(err))
	}
	return ops, nil
}

// operationsByChargeSQL selects the live operations (the partial index's
// rows) after the cursor $1 last changed in [$2, $3).
const operationsByChargeSQL = `SELECT ` + operationColumns + `, o.updated_at
FROM charge_operations o
WHERE o.status <> 'failed' AND o.charge_id > $1 AND o.updated_at >= $2 AND o.updated_at < $3`
