package sqlite

import (
	"context"
	"strings"
	"testing"
)

// TestPagesAreIndexRanges: a page of refunds or events is a range of an
// index, however deep in the merchant's history it starts. SQLite plans a
// statement when it is prepared, with no parameter values, so a filter
// written as "the parameter is empty OR the condition" can never bound an
// index search: seen failing, every page searched its index by merchant_id
// alone ("SEARCH r USING INDEX refunds_merchant_created (merchant_id=?)")
// and stepped over every newer row, and a charge's events walked the
// merchant's index. The plans are read from EXPLAIN QUERY PLAN of the very
// statements the store sends.
func TestPagesAreIndexRanges(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := migrated(t)
	for _, c := range []struct {
		name, charge, cursor string
		// index is how SQLite names the search it plans: the index, and
		// the columns that bound it.
		index string
	}{
		{"refunds", "", "", "refunds_merchant_created (merchant_id=?)"},
		{"refunds after a cursor", "", "re_1", "refunds_merchant_created (merchant_id=? AND (created_at,id)<(?,?))"},
		{"a charge's refunds", "ch_1", "", "refunds_merchant_charge (merchant_id=? AND charge_id=?)"},
		{"a charge's refunds after a cursor", "ch_1", "re_1", "refunds_merchant_charge (merchant_id=? AND charge_id=? AND (created_at,id)<(?,?))"},
		{"events", "", "", "webhook_events_merchant_created (merchant_id=?)"},
		{"events after a cursor", "", "evt_1", "webhook_events_merchant_created (merchant_id=? AND (created_at,id)<(?,?))"},
		{"a charge's events", "ch_1", "", "webhook_events_charge (charge_id=?)"},
		{"a charge's events after a cursor", "ch_1", "evt_1", "webhook_events_charge (charge_id=?)"},
	} {
		q, args := refundsPageSQL("m", c.charge, 1, c.cursor, 11)
		want := "SEARCH r USING INDEX " + c.index
		if strings.Contains(c.name, "events") {
			q, args = eventsPageSQL("m", c.charge, 1, c.cursor, 11)
			want = "SEARCH webhook_events USING INDEX " + c.index
		}
		rows, err := s.rdb.QueryContext(ctx, "EXPLAIN QUERY PLAN "+q, args...)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		var plan []string
		for rows.Next() {
			var id, parent, unused int
			var detail string
			if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
				t.Fatal(err)
			}
			plan = append(plan, detail)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		rows.Close()
		// SQLite says "COVERING INDEX" when the index holds every column read.
		got := strings.ReplaceAll(strings.Join(plan, "; "), "COVERING INDEX", "INDEX")
		if !strings.Contains(got, want) {
			t.Errorf("%s: plan %q; want %q", c.name, got, want)
		}
	}
}
