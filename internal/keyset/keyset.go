// Package keyset writes the WHERE and the ORDER BY of a keyset page of a
// merchant's records, newest first, for both stores.
package keyset

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/chargeonce/chargeonce"
)

// Page is a keyset page of a merchant's records (charges, refunds, events),
// newest first: at most Limit records past the cursor's (created_at, id),
// never an OFFSET.
type Page struct {
	// Mark is the stores' parameter mark: "$" for PostgreSQL, "?" for
	// SQLite.
	Mark string
	// Alias, when not empty, qualifies the columns: "c." for charges c.
	Alias      string
	MerchantID string
	// Column, when not empty, filters the records on it having Value:
	// charge_id for a charge's refunds or events, order_id for an order's
	// charges.
	Column string
	Value  any
	// At and Cursor are the cursor's created_at and id; no Cursor is the
	// first page.
	At     any
	Cursor string
	// Backward asks for the page before the cursor (ending_before): the
	// records just newer than it, oldest first, for the store to reverse.
	Backward bool
	Limit    int
}

// Where is the page's WHERE and its arguments: parameter 1 is the
// merchant, 2 the limit, then the filter's value and the cursor's
// (created_at, id) when the page has them.
//
// Only the filters the page has are written, so that each shape is a
// statement of its own and the cursor bounds the search of the index on
// (merchant_id, [charge_id | order_id, [status,]] created_at, id). Written
// once for every shape, each filter as "the parameter is empty OR the
// condition", no plan could bound the search: PostgreSQL's generic plan
// read every event through the primary key and sorted them (2,143 index
// blocks a page with 100,000 events), and SQLite, which plans a statement
// when it is prepared, stepped over every newer row of the merchant
// (postgres.TestReadsByIDUseThePrimaryKeyAsTablesGrow,
// sqlite.TestPagesAreIndexRanges).
func (p Page) Where() (string, []any) {
	args := []any{p.MerchantID, p.Limit}
	where := p.Alias + "merchant_id = " + p.Mark + "1"
	if p.Column != "" {
		args = append(args, p.Value)
		where += fmt.Sprintf(" AND %s%s = %s%d", p.Alias, p.Column, p.Mark, len(args))
	}
	if p.Cursor != "" {
		args = append(args, p.At, p.Cursor)
		op := "<"
		if p.Backward {
			op = ">"
		}
		where += fmt.Sprintf(" AND (%screated_at, %sid) %s (%s%d, %s%d)", p.Alias, p.Alias, op, p.Mark, len(args)-1, p.Mark, len(args))
	}
	return where, args
}

// Order is the page's ORDER BY: newest first, or oldest first from the
// cursor for a page backward.
func (p Page) Order() string {
	if p.Backward {
		return fmt.Sprintf("%screated_at, %sid", p.Alias, p.Alias)
	}
	return fmt.Sprintf("%screated_at DESC, %sid DESC", p.Alias, p.Alias)
}

// Where is the WHERE of a page of a merchant's refunds or events, newest
// first, and its arguments (Page.Where): parameter 1 is the merchant, 2 the
// limit, then the charge and the cursor's (created_at, id) when the request
// has them; mark is the stores' parameter mark.
func Where(mark, merchantID, chargeID string, at any, cursor string, limit int) (string, []any) {
	p := Page{Mark: mark, MerchantID: merchantID, At: at, Cursor: cursor, Limit: limit}
	if chargeID != "" {
		p.Column, p.Value = "charge_id", chargeID
	}
	return p.Where()
}

// Charges is the page of charges p asks for, its cursor's created_at (At)
// left for the store to read; mark and alias as Page's.
func Charges(p chargeonce.ChargesListParams, mark, alias string) Page {
	pg := Page{Mark: mark, Alias: alias, MerchantID: p.MerchantID, Limit: p.Limit + 1,
		Cursor: cmp.Or(p.StartingAfter, p.EndingBefore), Backward: p.EndingBefore != ""}
	if p.OrderID != 0 {
		pg.Column, pg.Value = "order_id", p.OrderID
	}
	return pg
}

// Trim cuts a page read with one record more than limit down to limit, and
// says whether there was more; a page read backward is put back newest
// first.
func Trim[T any](rows []T, limit int, backward bool) ([]T, bool) {
	more := len(rows) > limit
	if more {
		rows = rows[:limit]
	}
	if backward {
		slices.Reverse(rows)
	}
	return rows, more
}
