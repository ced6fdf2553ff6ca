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
// alone is the cursor) from the cursor, below p.ChargeMax when given, and
// filters on updated_at, the time an operation settled: no index is added
// for reconciliation. A run reads the index once, proportional to the
// manual charges up to the period's end rather than to the period's own.
func (s *Store) OperationsListByChargeReference(ctx context.Context, p chargeonce.ReconOperationsParams) ([]chargeonce.ReconOperation, error) {
	if p.Limit <= 0 || p.Limit > chargeonce.ReconMaxPage {
		return nil, chargeonce.FieldError("limit", "limit must be 1 to %d; got %d", chargeonce.ReconMaxPage, p.Limit)
	}
	if !chargeonce.ValidText(p.AfterCharge) || !chargeonce.ValidText(p.ChargeMax) {
		return nil, chargeonce.FieldError("after", "the cursor and bounds must be valid UTF-8 without U+0000")
	}
	// The bound is its own statement rather than ($5 = '' OR ...), so that
	// a generic plan still stops the index's range scan at ChargeMax.
	q, args := operationsByChargeSQL+`
ORDER BY o.charge_id LIMIT $4`, []any{p.AfterCharge, p.From, p.To, p.Limit}
	if p.ChargeMax != "" {
		q, args = operationsByChargeSQL+` AND o.charge_id < $5
ORDER BY o.charge_id LIMIT $4`, append(args, p.ChargeMax)
	}
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
