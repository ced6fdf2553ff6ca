package storetest

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
)

// testOperationsByChargeReferenceWalk: the captures and cancels of
// authorizations a period's reconciliation reads come a page at a time in
// charge id order, pending or succeeded (one that failed moved nothing and
// is not read), each with when it settled, within the period by that time
// and below ChargeMax.
func testOperationsByChargeReferenceWalk(t *testing.T, s chargeonce.Store, r chargeonce.ReconStore) {
	before := time.Now().Add(-time.Minute)
	var charges []chargeonce.Charge
	for range 4 {
		charges = append(charges, authorizedCharge(t, s, "m", 1000))
	}
	slices.SortFunc(charges, func(a, b chargeonce.Charge) int { return strings.Compare(a.ID, b.ID) })
	captured, canceled, retried := charges[0], charges[1], charges[2] // charges[3] stays authorized
	op := func(ch chargeonce.Charge, kind chargeonce.RecordKind, amount int64, status chargeonce.OperationStatus) string {
		t.Helper()
		p := newOperation(ch, kind, "op-"+randHex(6), amount)
		rec := insertOperation(t, s, p)
		if status != chargeonce.OperationPending {
			if err := completeOperation(t, s, rec, p.Token, status); err != nil {
				t.Fatalf("completing %s: %v", p.Operation.ID, err)
			}
		}
		return p.Operation.ID
	}
	want := []string{
		op(captured, chargeonce.KindCapture, 600, chargeonce.OperationSucceeded),
		op(canceled, chargeonce.KindCancel, 0, chargeonce.OperationSucceeded),
	}
	op(retried, chargeonce.KindCapture, 1000, chargeonce.OperationFailed)
	want = append(want, op(retried, chargeonce.KindCapture, 1000, chargeonce.OperationPending))
	after := time.Now().Add(time.Minute)

	walk := func(p chargeonce.ReconOperationsParams) []chargeonce.ReconOperation {
		t.Helper()
		var got []chargeonce.ReconOperation
		for pages := 0; ; pages++ {
			if pages > 100 {
				t.Fatal("more than 100 pages: the cursor does not advance")
			}
			page, err := r.OperationsListByChargeReference(t.Context(), p)
			if err != nil {
				t.Fatalf("OperationsListByChargeReference(after %q): %v", p.AfterCharge, err)
			}
			if len(page) > p.Limit {
				t.Fatalf("a page of %d operations, limit %d", len(page), p.Limit)
			}
			got = append(got, page...)
			if len(page) < p.Limit {
				return got
			}
			p.AfterCharge = page[len(page)-1].ChargeID
		}
	}
	for _, limit := range []int{1, 2, 1000} {
		got := walk(chargeonce.ReconOperationsParams{From: before, To: after, Limit: limit})
		var ids []string
		for i, o := range got {
			ids = append(ids, o.ID)
			if i > 0 && o.ChargeID <= got[i-1].ChargeID {
				t.Errorf("limit %d: charge %s after %s: not in byte order", limit, o.ChargeID, got[i-1].ChargeID)
			}
			if o.SettledAt.Before(o.CreatedAt) || o.SettledAt.Before(before) || !o.SettledAt.Before(after) {
				t.Errorf("limit %d: %s made %s, settled %s: not within the period after it was made", limit, o.ID, o.CreatedAt, o.SettledAt)
			}
		}
		if !slices.Equal(ids, want) {
			t.Errorf("limit %d: operations %q, want %q (the failed capture left out)", limit, ids, want)
		}
		if len(got) == 3 {
			if o := got[0]; o.Kind != chargeonce.KindCapture || o.AmountCents != 600 || o.Status != chargeonce.OperationSucceeded || o.ChargeID != captured.ID || o.MerchantID != "m" {
				t.Errorf("the capture read as %+v", o)
			}
			if o := got[1]; o.Kind != chargeonce.KindCancel || o.AmountCents != 1000 || o.Status != chargeonce.OperationSucceeded {
				t.Errorf("the cancel read as %+v", o)
			}
			if o := got[2]; o.Status != chargeonce.OperationPending {
				t.Errorf("the pending capture read as %+v", o)
			}
		}
	}
	if got := walk(chargeonce.ReconOperationsParams{From: before, To: after, ChargeMax: canceled.ID, Limit: 1}); len(got) != 1 || got[0].ID != want[0] {
		t.Errorf("below %s: %+v, want %s alone", canceled.ID, got, want[0])
	}
	// From ChargeMin on, and one charge's alone (reconciliation's point read).
	if got := walk(chargeonce.ReconOperationsParams{From: before, To: after, ChargeMin: canceled.ID, Limit: 1}); len(got) != 2 || got[0].ID != want[1] || got[1].ID != want[2] {
		t.Errorf("from %s: %+v, want %q", canceled.ID, got, want[1:])
	}
	if got := walk(chargeonce.ReconOperationsParams{From: before, To: after, ChargeMin: canceled.ID, ChargeMax: canceled.ID + "\x01", Limit: 1}); len(got) != 1 || got[0].ID != want[1] {
		t.Errorf("charge %s alone: %+v, want %s", canceled.ID, got, want[1])
	}
	if got := walk(chargeonce.ReconOperationsParams{From: before, To: after, ChargeMin: charges[3].ID, ChargeMax: charges[3].ID + "\x01", Limit: 1}); len(got) != 0 {
		t.Errorf("charge %s, still authorized: %+v, want none", charges[3].ID, got)
	}
	if got := walk(chargeonce.ReconOperationsParams{From: after, To: after.Add(time.Hour), Limit: 10}); len(got) != 0 {
		t.Errorf("a later period: %+v, want none", got)
	}
	if _, err := r.OperationsListByChargeReference(t.Context(), chargeonce.ReconOperationsParams{From: before, To: after}); chargeonce.ErrorCode(err) != chargeonce.EINVALID {
		t.Errorf("limit 0: %v, want EINVALID", err)
	}
}
