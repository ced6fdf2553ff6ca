// Package keyset writes the WHERE of a keyset page of a merchant's records,
// newest first, for both stores.
package keyset

import "fmt"

// Where is the WHERE of a page of a merchant's refunds or events, newest
// first, and its arguments: parameter 1 is the merchant, 2 the limit, then
// the charge and the cursor's (created_at, id) when the request has them;
// mark is the stores' parameter mark ("$" for PostgreSQL, "?" for SQLite).
//
// Only the filters the request has are written, so that each shape is a
// statement of its own and the cursor bounds the search of the index on
// (merchant_id, [charge_id,] created_at, id), as the charges' pages do.
// Written once for every shape, each filter as "the parameter is empty OR
// the condition", no plan could bound the search: PostgreSQL's generic plan
// read every event through the primary key and sorted them (2,143 index
// blocks a page with 100,000 events), and SQLite, which plans a statement
// when it is prepared, stepped over every newer row of the merchant
// (postgres.TestReadsByIDUseThePrimaryKeyAsTablesGrow,
// sqlite.TestPagesAreIndexRanges).
func Where(mark, merchantID, chargeID string, at any, cursor string, limit int) (string, []any) {
	args := []any{merchantID, limit}
	where := "merchant_id = " + mark + "1"
	if chargeID != "" {
		args = append(args, chargeID)
		where += fmt.Sprintf(" AND charge_id = %s%d", mark, len(args))
	}
	if cursor != "" {
		args = append(args, at, cursor)
		where += fmt.Sprintf(" AND (created_at, id) < (%s%d, %s%d)", mark, len(args)-1, mark, len(args))
	}
	return where, args
}
