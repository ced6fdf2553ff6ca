package sqlite

import (
	"context"
	"database/sql"

	"github.com/chargeonce/chargeonce"
)

// OperationsListByChargeReference returns one page of the captures and
// cancels of authorizations, pending or succeeded, last changed in
// [p.From, p.To), in charge id order, after p.AfterCharge: a walk of the
// partial unique index charge_operations_one_live (migration 0017: one
// pending or succeeded operation per charge, so the charge id alone is the
// cursor) from the cursor (or p.ChargeMin), below p.ChargeMax when given,
// filtered on updated_at, the time an operation settled.
func (s *Store) OperationsListByChargeReference(ctx context.Context, p chargeonce.ReconOperationsParams) ([]chargeonce.ReconOperation, error) {
	if p.Limit <= 0 || p.Limit > chargeonce.ReconMaxPage {
		return nil, chargeonce.FieldError("limit", "limit must be 1 to %d; got %d", chargeonce.ReconMaxPage, p.Limit)
	}
	q, args := sqlOperationsByChargeReference, []any{p.AfterCharge, p.From.UnixMicro(), p.To.UnixMicro(), p.Limit}
	switch {
	case p.ChargeMin != "":
		// ?5 is '' without ChargeMax: the point read of one charge's
		// operation sets both.
		q, args = sqlOperationsByChargeReferenceFrom, append(args, p.ChargeMax, p.ChargeMin)
	case p.ChargeMax != "":
		q, args = sqlOperationsByChargeReferenceBelow, append(args, p.ChargeMax)
	}
	rows, err := s.rdb.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, wrap("listing operations by charge reference", err)
	}
	defer rows.Close()
	ops := make([]chargeonce.ReconOperation, 0, min(p.Limit, 64))
	for rows.Next() {
		var (
			r       operationRow
			settled sql.NullInt64
		)
		if err := rows.Scan(append(r.nullDest(), &settled)...); err != nil {
			return nil, wrap("listing operations by charge reference", err)
		}
		ops = append(ops, chargeonce.ReconOperation{Operation: *r.operationOrNil(), SettledAt: fromMicros(settled.Int64)})
	}
	if err := rows.Err(); err != nil {
		return nil, wrap("listing operations by charge reference", err)
	}
	return ops, nil
}

const (
	sqlOperationsByChargeReference = `SELECT ` + operationColumnsO + `, o.updated_at
FROM charge_operations o INDEXED BY charge_operations_one_live
WHERE o.status <> 'failed' AND o.charge_id > ?1 AND o.updated_at >= ?2 AND o.updated_at < ?3
ORDER BY o.charge_id LIMIT ?4`
	sqlOperationsByChargeReferenceBelow = `SELECT ` + operationColumnsO + `, o.updated_at
FROM charge_operations o INDEXED BY charge_operations_one_live
WHERE o.status <> 'failed' AND o.charge_id > ?1 AND o.charge_id < ?5 AND o.updated_at >= ?2 AND o.updated_at < ?3
ORDER BY o.charge_id LIMIT ?4`
	sqlOperationsByChargeReferenceFrom = `SELECT ` + operationColumnsO + `, o.updated_at
FROM charge_operations o INDEXED BY charge_operations_one_live
WHERE o.status <> 'failed' AND o.charge_id > ?1 AND o.charge_id >= ?6 AND (?5 = '' OR o.charge_id < ?5) AND o.updated_at >= ?2 AND o.updated_at < ?3
ORDER BY o.charge_id LIMIT ?4`
)
