package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/internal/keyset"
)

// ChargesList returns one page of the merchant's charges, newest first
// (created_at, then id, both descending), and whether more lie beyond it.
//
// As in the PostgreSQL store, the query is a keyset range, never an OFFSET:
// one arm per status, UNION ALL, each a range scan of an index on
// (merchant_id, [order_id,] status, created_at, id) (migration 0007) from
// the cursor's (created_at, id), stopping after Limit+1 entries. A page
// reads at most three times Limit+1 index entries, however many charges the
// merchant holds. Reads use the read pool: they never wait for the writer.
func (s *Store) ChargesList(ctx context.Context, p chargeonce.ChargesListParams) (chargeonce.ChargesPage, error) {
	if err := p.Check(); err != nil {
		return chargeonce.ChargesPage{}, err
	}
	if !chargeonce.ValidText(p.MerchantID) {
		return chargeonce.ChargesPage{Charges: []chargeonce.Charge{}}, nil
	}
	if s.closing.Load() {
		return chargeonce.ChargesPage{}, translate(errClosed)
	}
	pg := keyset.Charges(p, "?", "c.")
	if pg.Cursor != "" {
		at, err := s.cursor(ctx, p.MerchantID, pg.Cursor, p.CursorParam())
		if err != nil {
			return chargeonce.ChargesPage{}, err
		}
		pg.At = at
	}
	where, args := pg.Where()
	inner := pg.Order()
	pg.Alias = ""
	order := pg.Order()
	statuses := chargeonce.Statuses
	if p.Status != "" {
		statuses = []chargeonce.Status{p.Status}
	}
	var q strings.Builder
	for i, st := range statuses {
		if i > 0 {
			q.WriteString("\nUNION ALL\n")
		}
		// st is one of the three constants, never the client's text.
		fmt.Fprintf(&q, "SELECT * FROM (SELECT %s FROM charges c WHERE %s AND c.status = '%s' ORDER BY %s LIMIT ?2)",
			chargeColumnsC, where, st, inner)
	}
	fmt.Fprintf(&q, "\nORDER BY %s LIMIT ?2", order)

	rows, err := s.rdb.QueryContext(ctx, q.String(), args...)
	if err != nil {
		return chargeonce.ChargesPage{}, wrap("listing charges", err)
	}
	defer rows.Close()
	page := chargeonce.ChargesPage{Charges: []chargeonce.Charge{}}
	for rows.Next() {
		var r chargeRow
		if err := rows.Scan(r.dest()...); err != nil {
			return chargeonce.ChargesPage{}, wrap("listing charges", err)
		}
		page.Charges = append(page.Charges, r.charge())
	}
	if err := rows.Err(); err != nil {
		return chargeonce.ChargesPage{}, wrap("listing charges", err)
	}
	page.Charges, page.HasMore = keyset.Trim(page.Charges, p.Limit, pg.Backward)
	return page, nil
}

// cursor returns the created_at (unix µs) of the merchant's charge id, the
// place a page starts from. A cursor that is not one of the merchant's
// charges is the client's mistake, named by param.
func (s *Store) cursor(ctx context.Context, merchantID, id, param string) (int64, error) {
	bad := chargeonce.FieldError(param, "%s must be the id of one of your charges", param)
	if !chargeonce.ValidText(id) {
		return 0, bad
	}
	var at int64
	err := s.rdb.QueryRowContext(ctx, `SELECT created_at FROM charges WHERE id = ?1 AND merchant_id = ?2`, id, merchantID).Scan(&at)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, bad
	}
	if err != nil {
		return 0, wrap("reading the list's cursor", err)
	}
	return at, nil
}
