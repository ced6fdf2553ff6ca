package admin_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/admin"
	"github.com/chargeonce/chargeonce/internal/apitest"
)

// TestStuckListLeavesOutLiveLeases (issue 34, item 4): a charge an attempt
// is driving right now (its capture at a slow acquirer, under a live
// lease) is not in the stuck list, whose answer may still arrive; with
// include_leased=1 it is, marked in_flight, and the console links both
// ways. A charge backed off by recovery is listed either way.
func TestStuckListLeavesOutLiveLeases(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"postgres", "sqlite"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			e := setupSim(t, kind, testOptions, acquirer.Options{Slow: 3 * time.Second})
			backedOff, _ := e.stuck(t, "backed-off")
			answered := make(chan apitest.Result, 1)
			body := fmt.Sprintf(`{"order_id":%d,"amount_cents":900,"payment_token":"tok_slow"}`, e.orders.Add(1))
			go func() { answered <- apitest.Charge(t, e.api.URL, "slow", body) }()

			list := func(query string) []admin.StuckJSON {
				t.Helper()
				st, b := e.call(t, "GET", "/admin/v1/charges"+query, aliceKey, nil)
				if st != 200 {
					t.Fatalf("stuck list%s: %d %s", query, st, b)
				}
				var l struct{ Data []admin.StuckJSON }
				if err := json.Unmarshal(b, &l); err != nil {
					t.Fatal(err)
				}
				return l.Data
			}
			var inFlight string
			apitest.Eventually(t, 2*time.Second, "the slow charge is listed with include_leased=1", func() bool {
				for _, r := range list("?include_leased=1") {
					if r.InFlight {
						inFlight = r.ID
					}
				}
				return inFlight != ""
			})
			got := list("")
			if len(got) != 1 || got[0].ID != backedOff || got[0].InFlight {
				t.Fatalf("stuck list while a capture is in flight = %+v; want only the backed-off %s", got, backedOff)
			}
			all := list("?include_leased=1")
			if len(all) != 2 {
				t.Fatalf("with include_leased=1: %+v, want the backed-off and the in-flight charge", all)
			}
			for _, r := range all {
				if r.InFlight != (r.ID == inFlight) || (r.ID != inFlight && r.ID != backedOff) {
					t.Errorf("row %s in_flight=%v (in flight: %s)", r.ID, r.InFlight, inFlight)
				}
			}
			if st, b := e.call(t, "GET", "/admin/v1/charges?include_leased=yes", aliceKey, nil); st != 400 || !strings.Contains(string(b), "include_leased") {
				t.Errorf("include_leased=yes: %d %s, want 400 naming it", st, b)
			}
			// The console: left out, with a link to show it; shown, marked.
			c := e.console(t)
			page := c.get(t, "/admin/")
			if strings.Contains(page, inFlight) || !strings.Contains(page, backedOff) || !strings.Contains(page, `href="/admin/?include_leased=1"`) {
				t.Errorf("console list without include_leased: in flight shown, or no link to show it:\n%s", page)
			}
			page = c.get(t, "/admin/?include_leased=1")
			if !strings.Contains(page, inFlight) || !strings.Contains(page, "in flight") {
				t.Errorf("console list with include_leased=1 misses %s or its mark:\n%s", inFlight, page)
			}
			<-answered // 202: the capture outlasts the acquirer timeout
		})
	}
}
