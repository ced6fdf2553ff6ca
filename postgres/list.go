package postgres

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/internal/keyset"
)

// ChargesList returns one page of the merchant's charges, newest first
// (created_at, then id, both descending), and whether more lie beyond it.
//
// The query is a keyset range, never an OFFSET: a cursor is a charge, and
// the page is the Limit+1 charges just past its (created_at, id), the one
// extra telling whether there are more. Each status is one arm of a UNION
// ALL that walks its own stretch of an index on (merchant_id, [order_id,]
// status, created_at, id) (migration 0007) from the cursor and stops after
// Limit+1 entries; PostgreSQL merges the arms in order (Merge Append). A
// page therefore reads at most three times Limit+1 index entries, however
// many charges the merchant, the order or a status holds.
func (s *Store) ChargesList(ctx context.Context, p chargeonce.ChargesListParams) (chargeonce.ChargesPage, error) {
	if err := p.Check(); err != nil {
		return chargeonce.ChargesPage{}, err
	}
	if !chargeonce.ValidText(p.MerchantID) {
		return chargeonce.ChargesPage{Charges: []chargeonce.Charge{}}, nil
	}
	pg := keyset.Charges(p, "$", "")
	if pg.Cursor != "" {
		at, err := s.cursor(ctx, p.MerchantID, pg.Cursor, p.CursorParam())
		if err != nil {
			return chargeonce.ChargesPage{}, err
		}
		pg.At = at
	}
	where, args := pg.Where()
	order := pg.Order()
	statuses := chargeonce.Statuses
	if p.Status != "" {
		statuses = []chargeonce.Status{p.Status}
	}
	var q strings.Builder
	fmt.Fprintf(&q, "SELECT %s FROM (", chargeColumns)
	for i, st := range statuses {
		if i > 0 {
			q.WriteString("\nUNION ALL\n")
		}
		// st is one of the three constants, never the client's text.
		fmt.Fprintf(&q, "(SELECT %s FROM charges WHERE %s AND status = '%s' ORDER BY %s LIMIT $2)",
			chargeColumns, where, st, order)
	}
	fmt.Fprintf(&q, ") AS page ORDER BY %s LIMIT $2", order)

	rows, err := s.pool.Query(ctx, q.String(), args...)
	if err != nil {
		return chargeonce.ChargesPage{}, fmt.Errorf("listing charges: %w", translate(err))
	}
	charges, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (chargeonce.Charge, error) { return scanCharge(row) })
	if err != nil {
		return chargeonce.ChargesPage{}, fmt.Errorf("listing charges: %w", translate(err))
	}
	page := chargeonce.ChargesPage{Charges: []chargeonce.Charge{}}
	if len(charges) > 0 {
		page.Charges, page.HasMore = keyset.Trim(charges, p.Limit, pg.Backward)
	}
	return page, nil
}

// cursor returns the created_at of the merchant's charge id, the place a
// page starts from. A cursor that is not one of the merchant's charges is
// the client's mistake, named by param.
func (s *Store) cursor(ctx context.Context, merchantID, id, param string) (time.Time, error) {
	bad := chargeonce.FieldError(param, "%s must be the id of one of your charges", param)
	if !chargeonce.ValidText(id) {
		return time.Time{}, bad
	}
	var (
		at    time.Time
		owner string
	)
	err := s.pool.QueryRow(ctx, `SELECT created_at, merchant_id FROM charges WHERE id = $1`, id).Scan(&at, &owner) // byID
	if notTheirs(err, owner, merchantID) {
		return time.Time{}, bad
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("reading the list's cursor: %w", translate(err))
	}
	return at, nil
}
