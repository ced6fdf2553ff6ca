package admin_test

import (
	"encoding/json"
	"fmt"
	"strconv"
	"testing"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/admin"
	"github.com/chargeonce/chargeonce/internal/apitest"
)

// TestAuditPagesSayHasMore: GET /admin/v1/audit says has_more, as every
// other page of the API does, and the pages joined by before= hold every
// entry once; it answered data alone, so a full page could not tell a
// client whether to ask again.
func TestAuditPagesSayHasMore(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"postgres", "sqlite"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			e := setup(t, kind)
			r := apitest.Charge(t, e.api.URL, "audited", fmt.Sprintf(`{"order_id":%d,"amount_cents":900,"payment_token":"tok_ok"}`, e.orders.Add(1)))
			var ch struct{ ID string }
			if r.Status != 201 || json.Unmarshal(r.Body, &ch) != nil {
				t.Fatalf("charge: %d %s", r.Status, r.Body)
			}
			const n = chargeonce.StuckListDefaultLimit + 7
			entries := make([]chargeonce.HistoryEntry, n)
			for i := range entries {
				entries[i] = chargeonce.HistoryEntry{ChargeID: ch.ID, MerchantID: "demo", Kind: chargeonce.HistoryResolveRefused,
					Actor: "admin:alice", Outcome: "captured", Reason: "entry " + strconv.Itoa(i)}
			}
			if err := e.store.(chargeonce.HistoryAppender).HistoryAppend(t.Context(), entries...); err != nil {
				t.Fatal(err)
			}
			seen := map[int64]bool{}
			path := "/admin/v1/audit"
			for page := 0; ; page++ {
				st, b := e.call(t, "GET", path, aliceKey, nil)
				var p struct {
					Data    []admin.EntryJSON
					HasMore *bool `json:"has_more"`
				}
				if st != 200 || json.Unmarshal(b, &p) != nil || p.HasMore == nil {
					t.Fatalf("GET %s: %d %.300s…; want a page with has_more", path, st, b)
				}
				for _, en := range p.Data {
					if seen[en.ID] {
						t.Fatalf("entry %d on two pages", en.ID)
					}
					seen[en.ID] = true
				}
				if want := page == 0; *p.HasMore != want || (want && len(p.Data) != chargeonce.StuckListDefaultLimit) {
					t.Fatalf("page %d: %d entries, has_more %v; want has_more %v", page, len(p.Data), *p.HasMore, want)
				}
				if !*p.HasMore {
					break
				}
				path = "/admin/v1/audit?before=" + strconv.FormatInt(p.Data[len(p.Data)-1].ID, 10)
			}
			if len(seen) != n {
				t.Fatalf("the pages held %d entries; want %d", len(seen), n)
			}
		})
	}
}
