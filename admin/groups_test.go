package admin_test

import (
	"encoding/json"
	"fmt"
	"html"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/admin"
	"github.com/chargeonce/chargeonce/internal/apitest"
)

// TestBulkSettleByCause: stuck charges are grouped by cause with their
// count, total and oldest age; "look up all and settle those the acquirer
// answers", run on every group, settles the three the acquirer captured
// (reply lost) with one audit entry each, and leaves the two it never saw
// to recovery.
func TestBulkSettleByCause(t *testing.T) {
	t.Parallel()
	e := setup(t, "sqlite")
	var captured, unseen []string
	for i := range 3 {
		r := apitest.Charge(t, e.api.URL, fmt.Sprintf("lost-%d", i), fmt.Sprintf(`{"order_id":%d,"amount_cents":1000,"currency":"JPY","payment_token":"tok_fail_after"}`, e.orders.Add(1)))
		var ch struct{ ID string }
		if err := json.Unmarshal(r.Body, &ch); err != nil || r.Status != 202 {
			t.Fatalf("tok_fail_after: %d %s", r.Status, r.Body)
		}
		captured = append(captured, ch.ID)
	}
	for i := range 2 {
		id, _ := e.stuck(t, fmt.Sprintf("down-%d", i))
		unseen = append(unseen, id)
	}
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar}
	get := func(path string, form url.Values) string {
		t.Helper()
		var resp *http.Response
		var err error
		if form == nil {
			resp, err = c.Get(e.admin.URL + path)
		} else {
			resp, err = c.PostForm(e.admin.URL+path, form)
		}
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", path, resp.StatusCode, b)
		}
		return string(b)
	}
	get("/admin/login", url.Values{"key": {aliceKey}})
	list := get("/admin/", nil)
	csrf := regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`).FindStringSubmatch(list)
	causes := regexp.MustCompile(`name="cause" value="([^"]+)"`).FindAllStringSubmatch(list, -1)
	if csrf == nil || len(causes) < 2 {
		t.Fatalf("the stuck list shows no groups:\n%s", list)
	}
	if !strings.Contains(list, "3,000 JPY") {
		t.Errorf("no group totals ¥3,000:\n%s", list)
	}
	for _, m := range causes {
		t.Logf("group: %s", html.UnescapeString(m[1]))
		get("/admin/bulk", url.Values{"csrf": {csrf[1]}, "cause": {html.UnescapeString(m[1])}, "reason": {"outage 2026-12-06, ticket 77"}})
	}
	status := func(id string) chargeonce.Status {
		_, b := e.call(t, "GET", "/admin/v1/charges/"+id, aliceKey, nil)
		var d admin.ChargeDetailJSON
		_ = json.Unmarshal(b, &d)
		return d.Charge.Status
	}
	for _, id := range captured {
		if st := status(id); st != chargeonce.StatusCaptured {
			t.Errorf("%s, captured at the acquirer: %s after the bulk action", id, st)
		}
	}
	for _, id := range unseen {
		if st := status(id); st != chargeonce.StatusProcessing {
			t.Errorf("%s, never seen by the acquirer: %s after the bulk action; want it left to recovery", id, st)
		}
	}
	_, b := e.call(t, "GET", "/admin/v1/audit", aliceKey, nil)
	var audit struct{ Data []admin.EntryJSON }
	_ = json.Unmarshal(b, &audit)
	if len(audit.Data) != 3 {
		t.Errorf("audit entries: %d, want one per charge settled (3): %s", len(audit.Data), b)
	}
	for _, a := range audit.Data {
		if a.Actor != "admin:alice" || !strings.Contains(a.Reason, "ticket 77") {
			t.Errorf("audit entry %+v", a)
		}
	}
}
