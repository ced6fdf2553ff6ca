package storetest

import (
	"fmt"
	"maps"
	"sync"
	"testing"

	"github.com/chargeonce/chargeonce"
)

// testMetadataRoundTrips: a charge's metadata comes back from every read
// exactly as inserted (text that needs escaping and non-ASCII included),
// through the single and the batched insert alike, and a charge without
// metadata reads back with none.
func testMetadataRoundTrips(t *testing.T, s chargeonce.Store) {
	metas := []map[string]string{
		nil,
		{"order_ref": "A-1"},
		{"note": `quote " backslash \ <tag> & é 🥐`, "empty": "", "line": "a\nb\u2028c"},
	}
	// Twenty at once, so that the stores that batch concurrent inserts
	// take their batched path too.
	const n = 20
	params := make([]chargeonce.KeyInsertParams, n)
	recs := make([]chargeonce.KeyRecord, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range params {
		params[i] = newIntent("meta", fmt.Sprintf("meta-%d", i))
		params[i].Charge.OrderID = 880
		params[i].Charge.Metadata = maps.Clone(metas[i%len(metas)])
		wg.Go(func() {
			var inserted bool
			recs[i], inserted, errs[i] = s.KeyInsert(t.Context(), params[i])
			if errs[i] == nil && !inserted {
				errs[i] = fmt.Errorf("inserted=false for a new key")
			}
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("KeyInsert(%s): %v", params[i].Charge.IdempotencyKey, err)
		}
	}
	check := func(what string, got chargeonce.Charge, want map[string]string) {
		t.Helper()
		if !maps.Equal(got.Metadata, want) || (want == nil) != (got.Metadata == nil) {
			t.Fatalf("%s: metadata %#v, want %#v", what, got.Metadata, want)
		}
	}
	for i, p := range params {
		want := p.Charge.Metadata
		check("KeyInsert", recs[i].Charge, want)
		check("KeyGet", get(t, s, "meta", p.Charge.IdempotencyKey).Charge, want)
		ch, err := s.ChargeGet(t.Context(), "meta", p.Charge.ID)
		if err != nil {
			t.Fatalf("ChargeGet: %v", err)
		}
		check("ChargeGet", ch, want)
		// A second attempt on the key gets the first's record.
		again := newIntent("meta", p.Charge.IdempotencyKey)
		rec, inserted, err := s.KeyInsert(t.Context(), again)
		if err != nil || inserted {
			t.Fatalf("KeyInsert again: inserted=%v, %v", inserted, err)
		}
		check("KeyInsert of a taken key", rec.Charge, want)
		complete(t, s, "meta", p.Charge.IdempotencyKey, p.Token, []byte(`{}`))
		check("KeyGet after KeyComplete", get(t, s, "meta", p.Charge.IdempotencyKey).Charge, want)
	}
	list, err := s.ChargesListByOrder(t.Context(), "meta", 880)
	if err != nil || len(list) != n {
		t.Fatalf("ChargesListByOrder: %d charges, %v; want %d", len(list), err, n)
	}
	byID := map[string]map[string]string{}
	for _, p := range params {
		byID[p.Charge.ID] = p.Charge.Metadata
	}
	for _, ch := range list {
		check("ChargesListByOrder", ch, byID[ch.ID])
	}
}
