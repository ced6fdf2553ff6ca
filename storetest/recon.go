package storetest

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
)

// RunRecon runs the conformance tests of chargeonce.ReconStore; newStore is
// as for Run, and its stores must implement ReconStore.
func RunRecon(t *testing.T, newStore func(t *testing.T) chargeonce.Store) {
	tests := []struct {
		name string
		fn   func(t *testing.T, s chargeonce.Store, r chargeonce.ReconStore)
	}{
		{"ChargesByReferenceWalk", testChargesByReferenceWalk},
		{"ChargesByReferenceRange", testChargesByReferenceRange},
		{"ChargesByReferenceBadLimit", testChargesByReferenceBadLimit},
		{"RefundsByChargeReferenceWalk", testRefundsByChargeReferenceWalk},
		{"OperationsByChargeReferenceWalk", testOperationsByChargeReferenceWalk},
		{"RunSaveIsKeyedByPeriod", testRunSaveIsKeyedByPeriod},
		{"RunSaveConcurrentOneRow", testRunSaveConcurrentOneRow},
		{"RunSaveOneEventPerMerchant", testRunSaveOneEventPerMerchant},
		{"AcksAppendOnly", testAcksAppendOnly},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := newStore(t)
			r, ok := s.(chargeonce.ReconStore)
			if !ok {
				t.Fatalf("%T does not implement chargeonce.ReconStore", s)
			}
			tt.fn(t, s, r)
		})
	}
}

// walkByReference reads every page of [from, to) and fails on a page out of
// order or repeating a charge.
func walkByReference(t *testing.T, r chargeonce.ReconStore, from, to time.Time, limit int) []string {
	t.Helper()
	var ids []string
	p := chargeonce.ReconChargesParams{From: from, To: to, Limit: limit}
	for pages := 0; ; pages++ {
		if pages > 1000 {
			t.Fatal("more than 1000 pages: the cursor does not advance")
		}
		page, err := r.ChargesListByReference(t.Context(), p)
		if err != nil {
			t.Fatalf("ChargesListByReference(after %q): %v", p.After, err)
		}
		if len(page) > limit {
			t.Fatalf("a page of %d charges, limit %d", len(page), limit)
		}
		for _, c := range page {
			if len(ids) > 0 && c.ID <= ids[len(ids)-1] {
				t.Fatalf("charge %q after %q: not in byte order", c.ID, ids[len(ids)-1])
			}
			ids = append(ids, c.ID)
		}
		if len(page) < limit {
			return ids
		}
		p.After = page[len(page)-1].ID
	}
}

func testChargesByReferenceWalk(t *testing.T, s chargeonce.Store, r chargeonce.ReconStore) {
	// Ids in an order unlike insertion order, with byte-order traps: upper
	// case before lower, '_' between them, digits first.
	var want []string
	for i, id := range []string{"ch_b", "ch_A", "ch_a", "ch__", "ch_0", "ch_ab", "ch_B9", "ch_aa", "ch_z", "ch_1"} {
		p := newIntent(fmt.Sprintf("m%d", i%3), "k-"+id)
		p.Charge.ID = id
		insert(t, s, p)
		if i%2 == 0 {
			complete(t, s, p.Charge.MerchantID, p.Charge.IdempotencyKey, p.Token, []byte(`{}`))
		}
		want = append(want, id)
	}
	slices.Sort(want)
	now := time.Now()
	for _, limit := range []int{1, 3, 10, 1000} {
		got := walkByReference(t, r, now.Add(-time.Hour), now.Add(time.Hour), limit)
		if !slices.Equal(got, want) {
			t.Errorf("limit %d: %q, want %q (Go's byte order, every charge of every merchant once)", limit, got, want)
		}
	}
	// Id bounds: [ch_a, ch_b) holds ch_a, ch_aa and ch_ab, at any page size;
	// no upper bound reads to the end.
	for _, limit := range []int{1, 2, 1000} {
		p := chargeonce.ReconChargesParams{From: now.Add(-time.Hour), To: now.Add(time.Hour), IDMin: "ch_a", IDMax: "ch_b", Limit: limit}
		var got []string
		for range 10 {
			page, err := r.ChargesListByReference(t.Context(), p)
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range page {
				got = append(got, c.ID)
			}
			if len(page) < limit {
				break
			}
			p.After = page[len(page)-1].ID
		}
		if want := []string{"ch_a", "ch_aa", "ch_ab"}; !slices.Equal(got, want) {
			t.Errorf("ids in [ch_a, ch_b), limit %d: %q, want %q", limit, got, want)
		}
	}
	page, err := r.ChargesListByReference(t.Context(), chargeonce.ReconChargesParams{From: now.Add(-time.Hour), To: now.Add(time.Hour), IDMin: "ch_b", Limit: 1000})
	if got := len(page); err != nil || got != 2 { // ch_b, ch_z
		t.Errorf("ids from ch_b on: %d charges (%v), want 2", got, err)
	}

	// The charges carry what reconciliation compares (ch_0 was the fifth,
	// of merchant m1, completed as captured).
	page, err = r.ChargesListByReference(t.Context(), chargeonce.ReconChargesParams{From: now.Add(-time.Hour), To: now.Add(time.Hour), Limit: 1})
	if err != nil || len(page) != 1 {
		t.Fatalf("first page: %v %v", page, err)
	}
	if c := page[0]; c.ID != want[0] || c.AmountCents != 25000 || c.Currency != "BRL" || c.Status != chargeonce.StatusCaptured || c.MerchantID != "m1" || c.CreatedAt.IsZero() {
		t.Errorf("first charge %+v", c)
	}
}

func testChargesByReferenceRange(t *testing.T, s chargeonce.Store, r chargeonce.ReconStore) {
	p := newIntent("m", "k-1")
	insert(t, s, p)
	c := get(t, s, "m", "k-1").Charge
	at := c.CreatedAt
	for _, tc := range []struct {
		from, to time.Time
		want     int
	}{
		{at, at.Add(time.Microsecond), 1},                    // from is included
		{at.Add(-time.Second), at, 0},                        // to is excluded
		{at.Add(time.Microsecond), at.Add(time.Hour), 0},     // after
		{at.Add(-time.Hour), at.Add(-time.Microsecond), 0},   // before
		{at.Add(-24 * time.Hour), at.Add(24 * time.Hour), 1}, // a day around it
	} {
		got := walkByReference(t, r, tc.from, tc.to, 10)
		if len(got) != tc.want {
			t.Errorf("[%s, %s) around a charge created at %s: %d charges, want %d", tc.from, tc.to, at, len(got), tc.want)
		}
	}
}

func testChargesByReferenceBadLimit(t *testing.T, _ chargeonce.Store, r chargeonce.ReconStore) {
	now := time.Now()
	for _, limit := range []int{0, -1, chargeonce.ReconMaxPage + 1} {
		_, err := r.ChargesListByReference(t.Context(), chargeonce.ReconChargesParams{From: now.Add(-time.Hour), To: now, Limit: limit})
		wantCode(t, fmt.Sprintf("limit %d", limit), err, chargeonce.EINVALID)
	}
}

func testRunSaveIsKeyedByPeriod(t *testing.T, _ chargeonce.Store, r chargeonce.ReconStore) {
	_, err := r.ReconRunGet(t.Context(), "sim", "2026-12-06")
	wantCode(t, "ReconRunGet before any run", err, chargeonce.ENOTFOUND)
	from := time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC)
	run := chargeonce.ReconRun{Acquirer: "sim", Period: "2026-12-06", From: from, To: from.AddDate(0, 0, 1),
		Counts: map[string]int{"missing_internal": 2}, Report: []byte(`{"first":true}`)}
	first, err := r.ReconRunSave(t.Context(), run)
	if err != nil {
		t.Fatal(err)
	}
	if first.Runs != 1 || first.Counts["missing_internal"] != 2 || !first.From.Equal(run.From) || !first.To.Equal(run.To) || first.CreatedAt.IsZero() {
		t.Errorf("first save %+v", first)
	}
	// Another acquirer's run of the same day is another run.
	if other, err := r.ReconRunSave(t.Context(), chargeonce.ReconRun{Acquirer: "stripe", Period: "2026-12-06", From: from, To: run.To, Counts: map[string]int{}}); err != nil || other.Runs != 1 {
		t.Errorf("another acquirer's day: runs %d, %v", other.Runs, err)
	}
	run.Counts, run.Report = map[string]int{}, []byte(`{"second":true}`)
	again, err := r.ReconRunSave(t.Context(), run)
	if err != nil {
		t.Fatal(err)
	}
	got, err := r.ReconRunGet(t.Context(), "sim", "2026-12-06")
	if err != nil {
		t.Fatal(err)
	}
	if again.Runs != 2 || got.Runs != 2 || string(got.Report) != `{"second":true}` || len(got.Counts) != 0 || !got.CreatedAt.Equal(first.CreatedAt) {
		t.Errorf("after a re-run: %+v (first %+v), want the same run, replaced, runs 2", got, first)
	}
}

func testRunSaveConcurrentOneRow(t *testing.T, _ chargeonce.Store, r chargeonce.ReconStore) {
	const n = 20
	from := time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			_, err := r.ReconRunSave(t.Context(), chargeonce.ReconRun{Acquirer: "sim", Period: "2026-12-06", From: from, To: from.AddDate(0, 0, 1),
				Counts: map[string]int{"pending": i}, Report: []byte(`{}`)})
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("concurrent ReconRunSave: %v", err)
		}
	}
	got, err := r.ReconRunGet(t.Context(), "sim", "2026-12-06")
	if err != nil {
		t.Fatal(err)
	}
	if got.Runs != n {
		t.Errorf("%d concurrent runs of one day stored runs=%d, want %d: one row, every run counted", n, got.Runs, n)
	}
}

// testRefundsByChargeReferenceWalk: refunds come in (charge id, id) byte
// order whatever the page size, within the period and below ChargeMax.
func testRefundsByChargeReferenceWalk(t *testing.T, s chargeonce.Store, r chargeonce.ReconStore) {
	byCharge := map[string][]string{"ch_b": {"re_2", "re_1"}, "ch_A": {"re_9"}, "ch_a": {"re_0", "re_5"}}
	for _, id := range []string{"ch_b", "ch_A", "ch_a"} {
		p := newIntent("m", "k-"+id)
		p.Charge.ID = id
		insert(t, s, p)
		complete(t, s, p.Charge.MerchantID, p.Charge.IdempotencyKey, p.Token, []byte(`{}`))
		for _, rid := range byCharge[id] {
			rp := newRefund(p.Charge, "rk-"+rid, 100)
			rp.Refund.ID = rid
			insertRefund(t, s, rp)
		}
	}
	want := []string{"ch_A re_9", "ch_a re_0", "ch_a re_5", "ch_b re_1", "ch_b re_2"}
	now := time.Now()
	walk := func(p chargeonce.ReconRefundsParams) []string {
		var got []string
		for range 20 {
			page, err := r.RefundsListByChargeReference(t.Context(), p)
			if err != nil {
				t.Fatalf("RefundsListByChargeReference(after %q %q): %v", p.AfterCharge, p.AfterID, err)
			}
			for _, rf := range page {
				got = append(got, rf.ChargeID+" "+rf.ID)
				p.AfterCharge, p.AfterID = rf.ChargeID, rf.ID
				if rf.AmountCents != 100 || rf.Currency != "BRL" || rf.MerchantID != "m" || rf.Status != chargeonce.RefundPending || rf.CreatedAt.IsZero() {
					t.Errorf("refund %+v", rf)
				}
			}
			if len(page) < p.Limit {
				return got
			}
		}
		t.Fatal("20 pages: the cursor does not advance")
		return nil
	}
	for _, limit := range []int{1, 2, 1000} {
		if got := walk(chargeonce.ReconRefundsParams{From: now.Add(-time.Hour), To: now.Add(time.Hour), Limit: limit}); !slices.Equal(got, want) {
			t.Errorf("limit %d: %q, want %q", limit, got, want)
		}
		if got := walk(chargeonce.ReconRefundsParams{From: now.Add(-time.Hour), To: now.Add(time.Hour), ChargeMax: "ch_b", Limit: limit}); !slices.Equal(got, want[:3]) {
			t.Errorf("below ch_b, limit %d: %q, want %q", limit, got, want[:3])
		}
	}
	if got := walk(chargeonce.ReconRefundsParams{From: now.Add(-2 * time.Hour), To: now.Add(-time.Hour), Limit: 10}); len(got) != 0 {
		t.Errorf("an hour before the refunds: %q, want none", got)
	}
	if _, err := r.RefundsListByChargeReference(t.Context(), chargeonce.ReconRefundsParams{From: now, To: now.Add(time.Hour), Limit: chargeonce.ReconMaxPage + 1}); chargeonce.ErrorCode(err) != chargeonce.EINVALID {
		t.Errorf("limit over the maximum: %v, want EINVALID", err)
	}
}

// testRunSaveOneEventPerMerchant: saving a period's run writes one
// reconciliation.completed event per merchant of the run, however often the
// period is run; it is queued to the endpoints subscribed to it only; its
// object is the merchant's share as the latest run left it, and no other
// merchant can read it.
func testRunSaveOneEventPerMerchant(t *testing.T, s chargeonce.Store, r chargeonce.ReconStore) {
	m1, m2 := "m-rc1-"+randHex(4), "m-rc2-"+randHex(4)
	sub, err := s.WebhookEndpointCreate(t.Context(), chargeonce.WebhookEndpoint{
		ID: "we_" + randHex(8), MerchantID: m1, URL: "https://example.com/recon", Secret: "whsec_" + randHex(16),
		EnabledEvents: []string{chargeonce.EventReconciliationCompleted},
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.WebhookEndpointCreate(t.Context(), chargeonce.WebhookEndpoint{
		ID: "we_" + randHex(8), MerchantID: m2, URL: "https://example.com/captures", Secret: "whsec_" + randHex(16),
		EnabledEvents: []string{chargeonce.EventChargeCaptured},
	}); err != nil {
		t.Fatal(err)
	}
	day := time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC)
	for i := range 3 {
		run := chargeonce.ReconRun{Acquirer: "sim", Period: "2026-12-06", From: day, To: day.AddDate(0, 0, 1),
			Counts: map[string]int{"missing_internal": 2 - i}, Report: []byte(`{}`),
			Merchants: []chargeonce.ReconMerchantRun{
				{MerchantID: m1, Charges: 10 + i, Refunds: 1, Matched: 9, Counts: map[string]int{"missing_internal": 2 - i}},
				{MerchantID: m2, Charges: 5, Matched: 5, Counts: map[string]int{}},
			}}
		if _, err := r.ReconRunSave(t.Context(), run); err != nil {
			t.Fatalf("run %d: %v", i+1, err)
		}
	}
	for _, m := range []string{m1, m2} {
		page, err := s.WebhookEventsList(t.Context(), chargeonce.EventsListParams{MerchantID: m, Limit: 10})
		if err != nil {
			t.Fatal(err)
		}
		if len(page.Events) != 1 || page.Events[0].Type != chargeonce.EventReconciliationCompleted || page.Events[0].ObjectID == "" {
			t.Fatalf("%s's events after three runs: %+v, want one reconciliation.completed", m, page.Events)
		}
		ev := page.Events[0]
		got, err := r.ReconMerchantRunGet(t.Context(), m, ev.ObjectID)
		if err != nil {
			t.Fatal(err)
		}
		if got.MerchantID != m || got.Runs != 3 || got.Acquirer != "sim" || got.Period != "2026-12-06" || !got.From.Equal(day) {
			t.Errorf("%s's share %+v", m, got)
		}
		if m == m1 && (got.Charges != 12 || got.Counts["missing_internal"] != 0) {
			t.Errorf("m1's share %+v, want the latest run's (12 charges, 0 missing_internal)", got)
		}
		other := map[string]string{m1: m2, m2: m1}[m]
		if _, err := r.ReconMerchantRunGet(t.Context(), other, ev.ObjectID); chargeonce.ErrorCode(err) != chargeonce.ENOTFOUND {
			t.Errorf("%s reading %s's share: %v, want ENOTFOUND", other, m, err)
		}
	}
	var got []chargeonce.WebhookDelivery
	for range 5 {
		ds, err := s.WebhookDeliveriesClaim(t.Context(), time.Minute, 100, 100, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range ds {
			if d.Event.MerchantID == m1 || d.Event.MerchantID == m2 {
				got = append(got, d)
			}
		}
	}
	if len(got) != 1 || got[0].Endpoint.ID != sub.ID || got[0].Event.Type != chargeonce.EventReconciliationCompleted {
		t.Errorf("deliveries %+v, want one, of reconciliation.completed to %s", got, sub.ID)
	}
	if _, err := r.ReconRunSave(t.Context(), chargeonce.ReconRun{Acquirer: "sim", Period: "x", From: day, To: day.Add(time.Hour),
		Counts: map[string]int{}, Merchants: []chargeonce.ReconMerchantRun{{MerchantID: ""}}}); chargeonce.ErrorCode(err) != chargeonce.EINVALID {
		t.Errorf("a share without a merchant: %v, want EINVALID", err)
	}
	if _, err := r.ReconRunGet(t.Context(), "sim", "x"); chargeonce.ErrorCode(err) != chargeonce.ENOTFOUND {
		t.Errorf("the run of a refused save: %v, want ENOTFOUND (nothing half-written)", err)
	}
}

// testAcksAppendOnly: runs are listed latest first; an exception is
// acknowledged once, a second acknowledgement returns the first.
func testAcksAppendOnly(t *testing.T, s chargeonce.Store, r chargeonce.ReconStore) {
	ops, ok := s.(chargeonce.ReconOps)
	if !ok {
		t.Fatalf("%T does not implement chargeonce.ReconOps", s)
	}
	day := time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC)
	for _, p := range []string{"2026-12-05", "2026-12-06"} {
		if _, err := r.ReconRunSave(t.Context(), chargeonce.ReconRun{Acquirer: "sim", Period: p, From: day, To: day.Add(time.Hour),
			Counts: map[string]int{"missing_internal": 1}, Report: []byte(`{}`)}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Millisecond)
	}
	runs, err := ops.ReconRunsList(t.Context(), 10)
	if err != nil || len(runs) != 2 || runs[0].Period != "2026-12-06" || runs[0].Counts["missing_internal"] != 1 {
		t.Fatalf("ReconRunsList: %+v %v, want the two runs, latest first", runs, err)
	}
	a := chargeonce.ReconAck{Acquirer: "sim", Period: "2026-12-06", Type: "missing_internal", Reference: "ch_x", Actor: "alice", Note: "a test capture"}
	first, err := ops.ReconAckInsert(t.Context(), a)
	if err != nil || first.Actor != "alice" || first.At.IsZero() {
		t.Fatalf("ReconAckInsert: %+v %v", first, err)
	}
	a.Actor, a.Note = "bob", "again"
	again, err := ops.ReconAckInsert(t.Context(), a)
	if err != nil || again.Actor != "alice" || again.Note != "a test capture" || !again.At.Equal(first.At) {
		t.Errorf("a second acknowledgement: %+v %v, want the first kept", again, err)
	}
	acks, err := ops.ReconAcksList(t.Context(), "sim", "2026-12-06")
	if err != nil || len(acks) != 1 {
		t.Errorf("ReconAcksList: %+v %v, want one", acks, err)
	}
	if acks, err := ops.ReconAcksList(t.Context(), "sim", "2026-12-05"); err != nil || len(acks) != 0 {
		t.Errorf("another period's acknowledgements: %+v %v", acks, err)
	}
}
