package keyset_test

import (
	"reflect"
	"testing"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/internal/keyset"
)

// TestChargesPageShapes: the charges' pages through Page write the WHERE,
// arguments and ORDER BY the stores wrote by hand before, shape by shape.
func TestChargesPageShapes(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		p            chargeonce.ChargesListParams
		mark, alias  string
		where, order string
		args         []any
	}{
		{chargeonce.ChargesListParams{MerchantID: "m", Limit: 10}, "$", "",
			"merchant_id = $1", "created_at DESC, id DESC", []any{"m", 11}},
		{chargeonce.ChargesListParams{MerchantID: "m", Limit: 10, OrderID: 7, StartingAfter: "ch_1"}, "$", "",
			"merchant_id = $1 AND order_id = $3 AND (created_at, id) < ($4, $5)", "created_at DESC, id DESC",
			[]any{"m", 11, int64(7), "at", "ch_1"}},
		{chargeonce.ChargesListParams{MerchantID: "m", Limit: 5, EndingBefore: "ch_2"}, "?", "c.",
			"c.merchant_id = ?1 AND (c.created_at, c.id) > (?3, ?4)", "c.created_at, c.id",
			[]any{"m", 6, "at", "ch_2"}},
		{chargeonce.ChargesListParams{MerchantID: "m", Limit: 5, OrderID: 9}, "?", "c.",
			"c.merchant_id = ?1 AND c.order_id = ?3", "c.created_at DESC, c.id DESC",
			[]any{"m", 6, int64(9)}},
	} {
		pg := keyset.Charges(c.p, c.mark, c.alias)
		pg.At = "at"
		where, args := pg.Where()
		if where != c.where || pg.Order() != c.order {
			t.Errorf("%+v: WHERE %q ORDER BY %q, want %q, %q", c.p, where, pg.Order(), c.where, c.order)
		}
		if !reflect.DeepEqual(args, c.args) {
			t.Errorf("%+v: arguments %#v, want %#v", c.p, args, c.args)
		}
	}
}

// TestWhereRefundsAndEvents: Where, the refunds' and events' page, is
// unchanged by Page.
func TestWhereRefundsAndEvents(t *testing.T) {
	t.Parallel()
	where, args := keyset.Where("$", "m", "ch_1", "at", "re_1", 11)
	if want := "merchant_id = $1 AND charge_id = $3 AND (created_at, id) < ($4, $5)"; where != want {
		t.Errorf("WHERE %q, want %q", where, want)
	}
	if want := []any{"m", 11, "ch_1", "at", "re_1"}; !reflect.DeepEqual(args, want) {
		t.Errorf("arguments %#v, want %#v", args, want)
	}
	if where, _ := keyset.Where("?", "m", "", nil, "", 11); where != "merchant_id = ?1" {
		t.Errorf("WHERE %q, want merchant_id = ?1", where)
	}
}

// TestTrim: one record more than the limit says there is more; a page read
// backward comes back newest first.
func TestTrim(t *testing.T) {
	t.Parallel()
	if got, more := keyset.Trim([]int{5, 4, 3}, 2, false); !reflect.DeepEqual(got, []int{5, 4}) || !more {
		t.Errorf("forward: %v, %v", got, more)
	}
	if got, more := keyset.Trim([]int{3, 4}, 2, true); !reflect.DeepEqual(got, []int{4, 3}) || more {
		t.Errorf("backward: %v, %v", got, more)
	}
	if got, more := keyset.Trim([]int{}, 2, true); len(got) != 0 || more {
		t.Errorf("empty: %v, %v", got, more)
	}
}
