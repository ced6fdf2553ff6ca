package admin_test

import (
	"encoding/json"
	"fmt"
	"html"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/admin"
	"github.com/chargeonce/chargeonce/internal/apitest"
)

// stuckRefund captures a charge, then refunds it while the acquirer's
// answers to refunds are lost: the acquirer refunded, and the refund stays
// pending here, backed off for an hour.
func (e *env) stuckRefund(t *testing.T, key string) (chargeID, refundID string) {
	t.Helper()
	r := apitest.Charge(t, e.api.URL, "charge-"+key, fmt.Sprintf(`{"order_id":%d,"amount_cents":5000,"payment_token":"tok_ok"}`, e.orders.Add(1)))
	var ch struct{ ID string }
	if err := json.Unmarshal(r.Body, &ch); err != nil || r.Status != 201 {
		t.Fatalf("charge: %d %s", r.Status, r.Body)
	}
	e.acq.loseRefunds.Store(true)
	defer e.acq.loseRefunds.Store(false)
	rr, err := apitest.Do(t, nil, "POST", e.api.URL+"/v1/charges/"+ch.ID+"/refunds", []byte(`{"amount_cents":2000}`), map[string]string{"Idempotency-Key": key})
	var rf struct{ ID, Status string }
	if err != nil || rr.Status != 202 || json.Unmarshal(rr.Body, &rf) != nil || rf.Status != "pending" {
		t.Fatalf("refund with its answer lost: %d %s %v, want 202 pending", rr.Status, rr.Body, err)
	}
	return ch.ID, rf.ID
}

// TestStuckRefundsResolved (issue 35, item 5): a refund whose answer was
// lost is listed in the stuck list with its charge (kind "refund"), and
// resolved under the charges' rules: the acquirer is looked up first, a
// decision it contradicts is refused and audited, the one it confirms
// settles the refund with an audit entry, and the merchant's retry replays
// it. The bulk action settles a group of refunds the acquirer answers for.
func TestStuckRefundsResolved(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"postgres", "sqlite"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			e := setup(t, kind)
			chargeID, refundID := e.stuckRefund(t, "rf-lost-1")
			st, b := e.call(t, "GET", "/admin/v1/charges", aliceKey, nil)
			var list struct{ Data []admin.StuckJSON }
			if err := json.Unmarshal(b, &list); err != nil || st != 200 || len(list.Data) != 1 {
				t.Fatalf("stuck list: %d %s", st, b)
			}
			row := list.Data[0]
			if row.Kind != "refund" || row.Refund == nil || row.Refund.ID != refundID || row.ID != chargeID || row.Refund.AmountCents != 2000 || row.Refund.Status != chargeonce.RefundPending {
				t.Fatalf("the stuck refund's row: %s", b)
			}

			path := "/admin/v1/refunds/" + refundID + "/resolve"
			if st, b := e.call(t, "POST", path, aliceKey, admin.RefundResolveRequest{Status: "pending", Reason: "x"}); st != 400 {
				t.Errorf("resolve as pending: %d %s, want 400", st, b)
			}
			if st, b := e.call(t, "POST", "/admin/v1/refunds/"+chargeID+"/resolve", aliceKey, admin.RefundResolveRequest{Status: chargeonce.RefundFailed, Reason: "x"}); st != 404 {
				t.Errorf("resolve a charge's id as a refund: %d %s, want 404", st, b)
			}
			// Nor is a refund resolved as a charge: its record would be
			// completed with a charge's answer, and the refund left pending.
			if st, b := e.call(t, "POST", "/admin/v1/charges/"+refundID+"/resolve", aliceKey, admin.ResolveRequest{Status: chargeonce.StatusCaptured, Reason: "x", Force: true}); st != 404 {
				t.Fatalf("resolve a refund's id as a charge: %d %s, want 404", st, b)
			}
			st, b = e.call(t, "POST", path, aliceKey, admin.RefundResolveRequest{Status: chargeonce.RefundFailed, Reason: "support says it bounced"})
			if st != 409 || problemType(b) != chargeonce.EDISAGREES || !strings.Contains(string(b), "found: succeeded") {
				t.Fatalf("resolving as failed a refund the acquirer made: %d %s, want 409 %s naming its answer", st, b, chargeonce.EDISAGREES)
			}
			st, b = e.call(t, "POST", path, bobKey, admin.RefundResolveRequest{Status: chargeonce.RefundSucceeded, Reason: "acquirer support, ticket 51"})
			var res struct {
				Refund admin.RefundJSON
				Audit  admin.EntryJSON
			}
			if err := json.Unmarshal(b, &res); err != nil || st != 200 || res.Refund.Status != chargeonce.RefundSucceeded || res.Audit.Actor != "admin:bob" || res.Audit.ChargeID != refundID {
				t.Fatalf("resolving as succeeded: %d %s", st, b)
			}
			if st, b := e.call(t, "POST", path, aliceKey, admin.RefundResolveRequest{Status: chargeonce.RefundSucceeded, Reason: "again"}); st != 409 || problemType(b) != chargeonce.ENOTPROCESSING {
				t.Errorf("resolving it again: %d %s, want 409 %s", st, b, chargeonce.ENOTPROCESSING)
			}
			// The merchant's retry replays the resolved answer.
			rr, err := apitest.Do(t, nil, "POST", e.api.URL+"/v1/charges/"+chargeID+"/refunds", []byte(`{"amount_cents":2000}`), map[string]string{"Idempotency-Key": "rf-lost-1"})
			if err != nil || rr.Status != 201 || !strings.Contains(string(rr.Body), `"status":"succeeded"`) {
				t.Errorf("the merchant's retry: %d %s %v", rr.Status, rr.Body, err)
			}
			_, b = e.call(t, "GET", "/admin/v1/audit", aliceKey, nil)
			var audit struct{ Data []admin.EntryJSON }
			_ = json.Unmarshal(b, &audit)
			if len(audit.Data) != 2 || audit.Data[0].Kind != chargeonce.HistoryResolution || audit.Data[1].Kind != chargeonce.HistoryResolveRefused || audit.Data[1].ChargeID != refundID {
				t.Errorf("audit trail: %s; want the resolution, then the refused one", b)
			}

			// The console: the charge page shows its refunds; a group of
			// stuck refunds is settled by the bulk action.
			c := e.console(t)
			if page := c.get(t, "/admin/charges/"+chargeID); !strings.Contains(page, `id="refunds"`) || !strings.Contains(page, refundID) {
				t.Errorf("the charge's page does not show its refund:\n%s", page)
			}
			_, second := e.stuckRefund(t, "rf-lost-2")
			list2 := c.get(t, "/admin/")
			m := regexp.MustCompile(`name="kind" value="refund">\s*<input type="hidden" name="cause" value="([^"]+)"`).FindStringSubmatch(list2)
			if m == nil || m[1] != "refund sent, outcome unknown" {
				t.Fatalf("no group of refunds sent with their outcome unknown on the stuck list (%q):\n%s", m, list2)
			}
			bulk := c.post(t, "/admin/bulk", url.Values{"kind": {"refund"}, "cause": {html.UnescapeString(m[1])}, "reason": {"outage, ticket 52"}})
			if !strings.Contains(bulk, second) || !strings.Contains(bulk, "settled as <strong>succeeded</strong>") {
				t.Errorf("bulk over the refunds:\n%s", bulk)
			}
		})
	}
}
