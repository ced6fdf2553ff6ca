package storetest

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/chargeonce/chargeonce"
)

// pageTests are the conformance tests of ChargesList.
var pageTests = []struct {
	name string
	fn   func(t *testing.T, s chargeonce.Store)
}{
	{"ChargesListWalk", testChargesListWalk},
	{"ChargesListFilters", testChargesListFilters},
	{"ChargesListBadParams", testChargesListBadParams},
	{"ChargesListConcurrentInserts", testChargesListConcurrentInserts},
}

// pagedCharge is one charge the pagination tests stored.
type pagedCharge struct {
	id     string
	order  int64
	status chargeonce.Status
}

// insertCharges stores n charges of merchant, their ids rising with
// insertion order under prefix (so "newest first" has one answer even where
// the clock cannot tell inserts apart: ties go to the larger id), on orders
// 1 to 3 in turn, a third of them captured and a third declined. It returns
// them oldest first.
func insertCharges(t *testing.T, s chargeonce.Store, merchant, prefix string, n int) []pagedCharge {
	t.Helper()
	out := make([]pagedCharge, 0, n)
	for i := range n {
		p := newIntent(merchant, fmt.Sprintf("%s-key-%04d", prefix, i))
		p.Charge.ID = fmt.Sprintf("%s%04d", prefix, i)
		p.Charge.OrderID = int64(1 + i%3)
		insert(t, s, p)
		c := pagedCharge{id: p.Charge.ID, order: p.Charge.OrderID, status: chargeonce.StatusProcessing}
		switch i % 3 {
		case 1:
			complete(t, s, merchant, p.Charge.IdempotencyKey, p.Token, []byte(`{}`))
			c.status = chargeonce.StatusCaptured
		case 2:
			err := s.KeyComplete(t.Context(), chargeonce.KeyCompleteParams{
				MerchantID: merchant, Key: p.Charge.IdempotencyKey, Token: p.Token,
				ChargeStatus: chargeonce.StatusDeclined, DeclineCode: "insufficient_funds",
				ResponseStatus: 402, ResponseBody: []byte(`{}`), TTL: longTTL,
			})
			if err != nil {
				t.Fatalf("KeyComplete declined: %v", err)
			}
			c.status = chargeonce.StatusDeclined
		}
		out = append(out, c)
	}
	return out
}

// newestFirst returns the ids of the charges that keep passes, newest first.
func newestFirst(charges []pagedCharge, keep func(pagedCharge) bool) []string {
	var ids []string
	for i := len(charges) - 1; i >= 0; i-- {
		if keep == nil || keep(charges[i]) {
			ids = append(ids, charges[i].id)
		}
	}
	return ids
}

// listPage calls ChargesList and checks what every page must be: no more
// than the limit, the merchant's own charges, newest first.
func listPage(t *testing.T, s chargeonce.Store, p chargeonce.ChargesListParams) ([]string, bool) {
	t.Helper()
	page, err := s.ChargesList(t.Context(), p)
	if err != nil {
		t.Fatalf("ChargesList(%+v): %v", p, err)
	}
	if len(page.Charges) > p.Limit {
		t.Fatalf("ChargesList(%+v): %d charges, more than the limit", p, len(page.Charges))
	}
	var ids []string
	for i, c := range page.Charges {
		if c.MerchantID != p.MerchantID {
			t.Fatalf("ChargesList(%+v): charge %s of merchant %s", p, c.ID, c.MerchantID)
		}
		if p.OrderID != 0 && c.OrderID != p.OrderID || p.Status != "" && c.Status != p.Status {
			t.Fatalf("ChargesList(%+v): charge %s of order %d, %s, escapes the filter", p, c.ID, c.OrderID, c.Status)
		}
		if i > 0 && c.CreatedAt.After(page.Charges[i-1].CreatedAt) {
			t.Fatalf("ChargesList(%+v): charge %s created after the charge listed before it", p, c.ID)
		}
		ids = append(ids, c.ID)
	}
	return ids, page.HasMore
}

// walk lists every page of p forward (starting_after the last charge of
// each page) and, when back is set, backward from the last page again
// (ending_before the first charge of each page). It returns the charges of
// the forward walk and of the backward one, each newest first.
func walk(t *testing.T, s chargeonce.Store, p chargeonce.ChargesListParams, back bool) (forward, backward []string) {
	t.Helper()
	for pages := 0; ; pages++ {
		if pages > 10000 {
			t.Fatalf("walking %+v: more than 10000 pages", p)
		}
		ids, more := listPage(t, s, p)
		forward = append(forward, ids...)
		if !more {
			break
		}
		if len(ids) == 0 {
			t.Fatalf("walking %+v: an empty page says it has more", p)
		}
		p.StartingAfter = ids[len(ids)-1]
	}
	if !back || len(forward) == 0 {
		return forward, nil
	}
	// From the oldest charge back to the newest.
	p.StartingAfter, p.EndingBefore = "", forward[len(forward)-1]
	backward = []string{forward[len(forward)-1]}
	for pages := 0; ; pages++ {
		if pages > 10000 {
			t.Fatalf("walking %+v backward: more than 10000 pages", p)
		}
		ids, more := listPage(t, s, p)
		backward = append(ids, backward...)
		if !more {
			break
		}
		if len(ids) == 0 {
			t.Fatalf("walking %+v backward: an empty page says it has more", p)
		}
		p.EndingBefore = ids[0]
	}
	return forward, backward
}

func testChargesListWalk(t *testing.T, s chargeonce.Store) {
	prefix := "ch_" + randHex(4) + "_"
	charges := insertCharges(t, s, "ma", prefix, 21)
	insertCharges(t, s, "mb", "ch_"+randHex(4)+"_", 4)
	want := newestFirst(charges, nil)

	for _, limit := range []int{1, 2, 7, 10, 20, 21, 100} {
		fwd, back := walk(t, s, chargeonce.ChargesListParams{MerchantID: "ma", Limit: limit}, true)
		if !slices.Equal(fwd, want) {
			t.Fatalf("limit %d: the pages list %v, want every charge once, newest first: %v", limit, fwd, want)
		}
		if !slices.Equal(back, want) {
			t.Fatalf("limit %d: the pages walked backward list %v, want %v", limit, back, want)
		}
	}

	// A first page: the newest, and more to come.
	ids, more := listPage(t, s, chargeonce.ChargesListParams{MerchantID: "ma", Limit: 3})
	if !slices.Equal(ids, want[:3]) || !more {
		t.Fatalf("first page of 3 = %v, has_more %v; want %v, true", ids, more, want[:3])
	}
	// Exactly the rest: no more.
	ids, more = listPage(t, s, chargeonce.ChargesListParams{MerchantID: "ma", Limit: 18, StartingAfter: want[2]})
	if !slices.Equal(ids, want[3:]) || more {
		t.Fatalf("the last 18 = %v, has_more %v; want %v, false", ids, more, want[3:])
	}
	// Before the newest: nothing.
	ids, more = listPage(t, s, chargeonce.ChargesListParams{MerchantID: "ma", Limit: 10, EndingBefore: want[0]})
	if len(ids) != 0 || more {
		t.Fatalf("ending_before the newest = %v, has_more %v; want nothing", ids, more)
	}
	// A merchant with nothing stored.
	ids, more = listPage(t, s, chargeonce.ChargesListParams{MerchantID: "mc", Limit: 10})
	if len(ids) != 0 || more {
		t.Fatalf("a merchant with no charges: %v, has_more %v; want nothing", ids, more)
	}
}

func testChargesListFilters(t *testing.T, s chargeonce.Store) {
	prefix := "ch_" + randHex(4) + "_"
	charges := insertCharges(t, s, "ma", prefix, 30)
	insertCharges(t, s, "mb", "ch_"+randHex(4)+"_", 6)

	for _, order := range []int64{0, 1, 2, 3, 4} {
		for _, status := range append([]chargeonce.Status{""}, chargeonce.Statuses...) {
			want := newestFirst(charges, func(c pagedCharge) bool {
				return (order == 0 || c.order == order) && (status == "" || c.status == status)
			})
			p := chargeonce.ChargesListParams{MerchantID: "ma", OrderID: order, Status: status, Limit: 2}
			fwd, back := walk(t, s, p, true)
			if !slices.Equal(fwd, want) || len(want) > 0 && !slices.Equal(back, want) {
				t.Fatalf("order %d status %q: forward %v, backward %v; want %v", order, status, fwd, back, want)
			}
		}
	}

	// A cursor need not pass the filter: it is a place in the merchant's
	// charges. After the newest charge (order 3, declined), order 1's.
	all := newestFirst(charges, nil)
	ids, _ := listPage(t, s, chargeonce.ChargesListParams{MerchantID: "ma", OrderID: 1, Limit: 100, StartingAfter: all[0]})
	if want := newestFirst(charges, func(c pagedCharge) bool { return c.order == 1 }); !slices.Equal(ids, want) {
		t.Fatalf("order 1 after a charge of order 3: %v, want %v", ids, want)
	}
}

func testChargesListBadParams(t *testing.T, s chargeonce.Store) {
	mine := insertCharges(t, s, "ma", "ch_"+randHex(4)+"_", 1)[0].id
	theirs := insertCharges(t, s, "mb", "ch_"+randHex(4)+"_", 1)[0].id
	for _, tt := range []struct {
		name  string
		p     chargeonce.ChargesListParams
		field string
	}{
		{"limit 0", chargeonce.ChargesListParams{Limit: 0}, "limit"},
		{"limit over the max", chargeonce.ChargesListParams{Limit: chargeonce.ChargesListMaxLimit + 1}, "limit"},
		{"negative limit", chargeonce.ChargesListParams{Limit: -1}, "limit"},
		{"unknown status", chargeonce.ChargesListParams{Limit: 1, Status: "refunded"}, "status"},
		{"both cursors", chargeonce.ChargesListParams{Limit: 1, StartingAfter: mine, EndingBefore: mine}, "ending_before"},
		{"missing starting_after", chargeonce.ChargesListParams{Limit: 1, StartingAfter: "ch_no_such"}, "starting_after"},
		{"missing ending_before", chargeonce.ChargesListParams{Limit: 1, EndingBefore: "ch_no_such"}, "ending_before"},
		{"another merchant's starting_after", chargeonce.ChargesListParams{Limit: 1, StartingAfter: theirs}, "starting_after"},
		{"another merchant's ending_before", chargeonce.ChargesListParams{Limit: 1, EndingBefore: theirs}, "ending_before"},
		{"hostile cursor", chargeonce.ChargesListParams{Limit: 1, StartingAfter: "ch_\x00\xff"}, "starting_after"},
	} {
		tt.p.MerchantID = "ma"
		_, err := s.ChargesList(t.Context(), tt.p)
		wantCode(t, tt.name, err, chargeonce.EINVALID)
		var e *chargeonce.Error
		if !errors.As(err, &e) || e.Field != tt.field {
			t.Fatalf("%s: error %v, want one naming %s", tt.name, err, tt.field)
		}
	}
	// A hostile merchant sees nothing, and is no error.
	page, err := s.ChargesList(t.Context(), chargeonce.ChargesListParams{MerchantID: "m\x00a", Limit: 10})
	if err != nil || len(page.Charges) != 0 || page.HasMore {
		t.Fatalf("hostile merchant: %+v, %v; want an empty page", page, err)
	}
}

// testChargesListConcurrentInserts walks the pages while new charges keep
// arriving: every charge stored before the walk began is listed exactly
// once, and no charge twice. New charges are newer than any cursor, so a
// forward walk never meets them; a keyset cursor, unlike an offset, is not
// shifted by them.
func testChargesListConcurrentInserts(t *testing.T, s chargeonce.Store) {
	prefix := "ch_" + randHex(4) + "_"
	before := insertCharges(t, s, "ma", prefix, 60)
	want := newestFirst(before, nil)

	var (
		stop     atomic.Bool
		wg       sync.WaitGroup
		inserted atomic.Int64
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; !stop.Load() && i < 2000; i++ {
			p := newIntent("ma", fmt.Sprintf("%s-late-%d", prefix, i))
			p.Charge.ID = fmt.Sprintf("%slate%06d", prefix, i)
			if _, _, err := s.KeyInsert(t.Context(), p); err != nil {
				t.Errorf("KeyInsert during the walk: %v", err)
				return
			}
			inserted.Add(1)
		}
	}()
	var walks int
	for walks = 0; walks < 5; walks++ {
		got, _ := walk(t, s, chargeonce.ChargesListParams{MerchantID: "ma", Limit: 7}, false)
		seen := map[string]bool{}
		for _, id := range got {
			if seen[id] {
				t.Fatalf("walk %d: charge %s listed twice", walks, id)
			}
			seen[id] = true
		}
		// Charges inserted during the walk may or may not be listed (the
		// first page may see them); the older ones, all of them, in order.
		var old []string
		for _, id := range got {
			if slices.Contains(want, id) {
				old = append(old, id)
			}
		}
		if !slices.Equal(old, want) {
			t.Fatalf("walk %d: the charges stored before it, as listed: %v, want %v", walks, old, want)
		}
	}
	stop.Store(true)
	wg.Wait()
	t.Logf("%d walks of 60 old charges while %d new ones arrived", walks, inserted.Load())
}
