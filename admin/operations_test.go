package admin_test

import (
	"encoding/json"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/admin"
	"github.com/chargeonce/chargeonce/internal/apitest"
)

// stuckOperation authorizes a manual charge of amount, then captures
// (kind capture, body `{"amount_cents":capture}`) or cancels it while the
// acquirer's answers to captures and voids are lost: the acquirer settled
// it, and the operation stays pending here, backed off for an hour.
func (e *env) stuckOperation(t *testing.T, kind chargeonce.RecordKind, key string, amount int64, body string) (chargeID, opID string) {
	t.Helper()
	r := apitest.Charge(t, e.api.URL, "auth-"+key, fmt.Sprintf(`{"order_id":%d,"amount_cents":%d,"payment_token":"tok_ok","capture_method":"manual"}`, e.orders.Add(1), amount))
	var ch struct{ ID, Status string }
	if err := json.Unmarshal(r.Body, &ch); err != nil || r.Status != 201 || ch.Status != "authorized" {
		t.Fatalf("manual charge: %d %s", r.Status, r.Body)
	}
	e.acq.loseOperations.Store(true)
	defer e.acq.loseOperations.Store(false)
	rr := e.operate(t, kind, ch.ID, key, body)
	if rr.Status != 202 {
		t.Fatalf("%s with its answer lost: %d %s, want 202", kind, rr.Status, rr.Body)
	}
	rec, err := e.store.KeyGet(t.Context(), "demo", key)
	if err != nil || rec.Operation == nil || rec.Operation.Status != chargeonce.OperationPending {
		t.Fatalf("the %s's record: %+v, %v", kind, rec, err)
	}
	return ch.ID, rec.Operation.ID
}

// operate sends the merchant's capture or cancel of chargeID with key.
func (e *env) operate(t *testing.T, kind chargeonce.RecordKind, chargeID, key, body string) apitest.Result {
	t.Helper()
	r, err := apitest.Do(t, nil, "POST", e.api.URL+"/v1/charges/"+chargeID+"/"+string(kind), []byte(body), map[string]string{"Idempotency-Key": key})
	if err != nil {
		t.Fatalf("%s of %s: %v", kind, chargeID, err)
	}
	return r
}

// eventTypes counts the events of the merchant's charge by type.
func (e *env) eventTypes(t *testing.T, chargeID string) map[string]int {
	t.Helper()
	page, err := e.store.WebhookEventsList(t.Context(), chargeonce.EventsListParams{MerchantID: "demo", ChargeID: chargeID, Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, ev := range page.Events {
		out[ev.Type]++
	}
	return out
}

// TestStuckOperationsResolved (issue 35, item 5): a manual capture whose
// answer was lost is listed as its own kind with the charge it captures,
// its amount, age, attempts and next try; its page shows its timeline; it
// is resolved under the charges' rules: the acquirer is looked up first
// (OperationLookup), a decision it contradicts is refused (409
// acquirer-disagrees) and audited, the one it confirms settles the capture
// and its charge with an audit entry, the charge.captured event is written
// once, the merchant's retry of the capture replays the resolved answer,
// and the acquirer saw one capture. Ids of other kinds are 404 on each
// route, and bad bodies 400.
func TestStuckOperationsResolved(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"postgres", "sqlite"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			e := setup(t, kind)
			chargeID, opID := e.stuckOperation(t, chargeonce.KindCapture, "cp-lost-1", 5000, `{"amount_cents":4200}`)
			st, b := e.call(t, "GET", "/admin/v1/charges", aliceKey, nil)
			var list struct{ Data []admin.StuckJSON }
			if err := json.Unmarshal(b, &list); err != nil || st != 200 || len(list.Data) != 1 {
				t.Fatalf("stuck list: %d %s", st, b)
			}
			row := list.Data[0]
			if row.Kind != "capture" || row.Operation == nil || row.Operation.ID != opID || row.Operation.ChargeID != chargeID || row.ID != chargeID ||
				row.Status != chargeonce.StatusAuthorized || row.Operation.AmountCents != 4200 || row.Operation.Status != chargeonce.OperationPending ||
				row.AcquirerAttempts != 1 || time.Until(row.NextAttemptAt) < 30*time.Minute || row.InFlight || row.AgeSeconds < 0 || row.Refund != nil {
				t.Fatalf("the stuck capture's row: %s", b)
			}
			// The list's cursor may be an operation's id.
			if st, b := e.call(t, "GET", "/admin/v1/charges?after="+opID, aliceKey, nil); st != 200 || strings.Contains(string(b), opID) {
				t.Fatalf("the page after the capture: %d %s", st, b)
			}

			st, b = e.call(t, "GET", "/admin/v1/operations/"+opID, aliceKey, nil)
			var d admin.OperationDetailJSON
			if st != 200 || json.Unmarshal(b, &d) != nil || d.Operation.Kind != "capture" || d.Charge.ID != chargeID || d.Record == nil ||
				d.Record.State != chargeonce.KeyProcessing || historyKinds(d.History) != "inserted capture" || d.History[1].Outcome != admin.CaptureSentNoAnswer {
				t.Fatalf("the capture's detail: %d %s", st, b)
			}
			for _, p := range []string{"/admin/v1/operations/" + chargeID, "/admin/v1/operations/cp_nope", "/admin/v1/operations/vd_nope",
				"/admin/v1/operations/cp_%00", "/admin/v1/operations/cp_%FF%FE"} {
				if st, b := e.call(t, "GET", p, aliceKey, nil); st != 404 || problemType(b) != chargeonce.ENOTFOUND {
					t.Errorf("GET %s: %d %s, want 404", p, st, b)
				}
			}

			path := "/admin/v1/operations/" + opID + "/resolve"
			for _, bad := range []any{
				map[string]any{"status": "pending", "reason": "x"},
				map[string]any{"status": "captured", "reason": "x"},
				map[string]any{"status": "succeeded"},
				map[string]any{"status": "succeeded", "reason": "x", "failure_reason": "nope"},
				map[string]any{"status": "succeeded", "reason": "x", "extra": 1},
				"not an object",
			} {
				if st, b := e.call(t, "POST", path, bobKey, bad); st != 400 {
					t.Errorf("resolve %v: %d %s, want 400", bad, st, b)
				}
			}
			succeed := admin.OperationResolveRequest{Status: chargeonce.OperationSucceeded, Reason: "x", Force: true}
			for _, p := range []string{
				"/admin/v1/operations/" + chargeID + "/resolve", // a charge's id here
				"/admin/v1/operations/cp_nope/resolve",
				"/admin/v1/operations/cp_%00/resolve",
				"/admin/v1/operations/vd_%FF%FE/resolve",
			} {
				if st, b := e.call(t, "POST", p, aliceKey, succeed); st != 404 {
					t.Errorf("POST %s: %d %s, want 404", p, st, b)
				}
			}
			// Nor is the capture resolved as a charge or a refund.
			if st, b := e.call(t, "POST", "/admin/v1/charges/"+opID+"/resolve", aliceKey, admin.ResolveRequest{Status: chargeonce.StatusCaptured, Reason: "x", Force: true}); st != 404 {
				t.Fatalf("resolving the capture as a charge: %d %s, want 404", st, b)
			}
			if st, b := e.call(t, "POST", "/admin/v1/refunds/"+opID+"/resolve", aliceKey, admin.RefundResolveRequest{Status: chargeonce.RefundSucceeded, Reason: "x", Force: true}); st != 404 {
				t.Fatalf("resolving the capture as a refund: %d %s, want 404", st, b)
			}

			st, b = e.call(t, "POST", path, aliceKey, admin.OperationResolveRequest{Status: chargeonce.OperationFailed, Reason: "support says it bounced"})
			if st != 409 || problemType(b) != chargeonce.EDISAGREES || !strings.Contains(string(b), "found: succeeded") {
				t.Fatalf("resolving as failed a capture the acquirer made: %d %s, want 409 %s naming its answer", st, b, chargeonce.EDISAGREES)
			}
			st, b = e.call(t, "POST", path, bobKey, admin.OperationResolveRequest{Status: chargeonce.OperationSucceeded, Reason: "acquirer support, ticket 61"})
			var res struct {
				Operation admin.OperationJSON
				Charge    admin.ChargeJSON
				Audit     admin.EntryJSON
			}
			if err := json.Unmarshal(b, &res); err != nil || st != 200 || res.Operation.Status != chargeonce.OperationSucceeded || res.Charge.Status != chargeonce.StatusCaptured ||
				res.Audit.Actor != "admin:bob" || res.Audit.ChargeID != opID || res.Audit.Forced || !strings.Contains(res.Audit.Detail, "found: succeeded") {
				t.Fatalf("resolving as succeeded: %d %s", st, b)
			}
			if st, b := e.call(t, "POST", path, aliceKey, admin.OperationResolveRequest{Status: chargeonce.OperationSucceeded, Reason: "again"}); st != 409 || problemType(b) != chargeonce.ENOTPROCESSING {
				t.Errorf("resolving it again: %d %s, want 409 %s", st, b, chargeonce.ENOTPROCESSING)
			}
			// The merchant's retry of the capture replays the resolved answer.
			rr := e.operate(t, chargeonce.KindCapture, chargeID, "cp-lost-1", `{"amount_cents":4200}`)
			if rr.Status != 200 || rr.Header.Get("Idempotent-Replayed") != "true" || !strings.Contains(string(rr.Body), `"status":"captured"`) ||
				!strings.Contains(string(rr.Body), `"amount_captured_cents":4200`) {
				t.Errorf("the merchant's retry: %d %s", rr.Status, rr.Body)
			}
			if got := e.eventTypes(t, chargeID); got[chargeonce.EventChargeCaptured] != 1 || len(got) != 1 {
				t.Errorf("events of the charge: %v; want charge.captured once", got)
			}
			if n := e.acq.captures(opID); n != 1 {
				t.Errorf("capture requests for %s: %d, want 1 (the resolutions only looked up)", opID, n)
			}
			_, b = e.call(t, "GET", "/admin/v1/operations/"+opID, aliceKey, nil)
			if json.Unmarshal(b, &d) != nil || historyKinds(d.History) != "inserted resolve-refused resolution settled" || d.Charge.Status != chargeonce.StatusCaptured {
				t.Errorf("the capture's timeline after the resolution: %s", b)
			}
			_, b = e.call(t, "GET", "/admin/v1/audit", aliceKey, nil)
			var audit struct{ Data []admin.EntryJSON }
			_ = json.Unmarshal(b, &audit)
			if len(audit.Data) != 2 || audit.Data[0].Kind != chargeonce.HistoryResolution || audit.Data[1].Kind != chargeonce.HistoryResolveRefused || audit.Data[1].ChargeID != opID {
				t.Errorf("audit trail: %s; want the resolution, then the refused one", b)
			}
		})
	}
}

// TestStuckVoidResolvedWithoutAnAnswer: a void whose answer was lost,
// with the acquirer unreachable: the resolution is refused (409
// acquirer-unsure) unless forced; forced, it cancels the charge (one
// charge.canceled event), is audited as forced, and the merchant's retry
// of the cancel replays it.
func TestStuckVoidResolvedWithoutAnAnswer(t *testing.T) {
	t.Parallel()
	e := setup(t, "sqlite")
	chargeID, opID := e.stuckOperation(t, chargeonce.KindCancel, "vd-lost-1", 3000, ``)
	st, b := e.call(t, "GET", "/admin/v1/charges", aliceKey, nil)
	var list struct{ Data []admin.StuckJSON }
	if json.Unmarshal(b, &list) != nil || st != 200 || len(list.Data) != 1 || list.Data[0].Kind != "cancel" || list.Data[0].Operation.AmountCents != 3000 {
		t.Fatalf("stuck list: %d %s", st, b)
	}
	e.acq.down.Store(true)
	path := "/admin/v1/operations/" + opID + "/resolve"
	q := admin.OperationResolveRequest{Status: chargeonce.OperationSucceeded, Reason: "the acquirer's support says the hold is released"}
	if st, b := e.call(t, "POST", path, bobKey, q); st != 409 || problemType(b) != chargeonce.EUNSURE || !strings.Contains(string(b), "connection refused") {
		t.Fatalf("resolving with the acquirer unreachable: %d %s, want 409 %s quoting the lookup", st, b, chargeonce.EUNSURE)
	}
	q.Force = true
	st, b = e.call(t, "POST", path, bobKey, q)
	var res struct {
		Charge admin.ChargeJSON
		Audit  admin.EntryJSON
	}
	if st != 200 || json.Unmarshal(b, &res) != nil || !res.Audit.Forced || !strings.Contains(res.Audit.Detail, "lookup failed") || res.Charge.Status != chargeonce.StatusCanceled {
		t.Fatalf("forced resolution: %d %s, want 200, the charge canceled, a forced audit entry quoting the failed lookup", st, b)
	}
	e.acq.down.Store(false)
	if rr := e.operate(t, chargeonce.KindCancel, chargeID, "vd-lost-1", ``); rr.Status != 200 || rr.Header.Get("Idempotent-Replayed") != "true" || !strings.Contains(string(rr.Body), `"status":"canceled"`) {
		t.Errorf("the merchant's retry of the cancel: %d %s", rr.Status, rr.Body)
	}
	if got := e.eventTypes(t, chargeID); got[chargeonce.EventChargeCanceled] != 1 || len(got) != 1 {
		t.Errorf("events of the charge: %v; want charge.canceled once", got)
	}
}

// TestResolveOperationNeverTakesALiveLease: a capture an attempt drives
// under a live lease is left out of the list (shown with include_leased=1,
// in flight), and its resolution is refused 409 charge-in-flight with
// Retry-After, forced or not, with nothing changed.
func TestResolveOperationNeverTakesALiveLease(t *testing.T) {
	t.Parallel()
	e := setup(t, "postgres")
	r := apitest.Charge(t, e.api.URL, "auth-live", fmt.Sprintf(`{"order_id":%d,"amount_cents":900,"payment_token":"tok_ok","capture_method":"manual"}`, e.orders.Add(1)))
	var ch struct{ ID string }
	if err := json.Unmarshal(r.Body, &ch); err != nil || r.Status != 201 {
		t.Fatalf("manual charge: %d %s", r.Status, r.Body)
	}
	// An attempt inserted the capture and is at the acquirer, its lease
	// running for an hour.
	rec, inserted, err := e.store.OperationInsert(t.Context(), chargeonce.OperationInsertParams{
		Fingerprint: "fp", Token: "tok_attempt", Lease: time.Hour,
		Operation: chargeonce.Operation{ID: "cp_0123456789abcdef0123456789ab", Kind: chargeonce.KindCapture, MerchantID: "demo", IdempotencyKey: "cp-live", ChargeID: ch.ID},
	})
	if err != nil || !inserted {
		t.Fatalf("OperationInsert: %v, %v", inserted, err)
	}
	opID := rec.Operation.ID
	if _, b := e.call(t, "GET", "/admin/v1/charges", aliceKey, nil); strings.Contains(string(b), opID) {
		t.Fatalf("the stuck list holds a capture under a live lease: %s", b)
	}
	_, b := e.call(t, "GET", "/admin/v1/charges?include_leased=1", aliceKey, nil)
	var list struct{ Data []admin.StuckJSON }
	if json.Unmarshal(b, &list) != nil || len(list.Data) != 1 || list.Data[0].Operation == nil || list.Data[0].Operation.ID != opID || !list.Data[0].InFlight {
		t.Fatalf("include_leased=1: %s, want the capture in flight", b)
	}
	for _, force := range []bool{false, true} {
		q := admin.OperationResolveRequest{Status: chargeonce.OperationFailed, Reason: "support says no", Force: force}
		if st, b := e.call(t, "POST", "/admin/v1/operations/"+opID+"/resolve", bobKey, q); st != 409 || problemType(b) != chargeonce.ELEASED {
			t.Fatalf("resolving (force %v) a capture under a live lease: %d %s, want 409 %s", force, st, b, chargeonce.ELEASED)
		}
	}
	if got, err := e.store.KeyGet(t.Context(), "demo", "cp-live"); err != nil || got.Token != "tok_attempt" || !got.LeaseHeld {
		t.Fatalf("the refused resolutions changed the record: %+v, %v", got, err)
	}
}

// TestStuckOperationsOnTheConsole: the console lists a stuck capture and a
// stuck void in groups of their own kinds, shows the capture's page and
// timeline, asks the acquirer before the form (no outcome preselected),
// confirms, settles; the bulk action settles the group of voids.
func TestStuckOperationsOnTheConsole(t *testing.T) {
	t.Parallel()
	e := setup(t, "postgres")
	chargeID, opID := e.stuckOperation(t, chargeonce.KindCapture, "cp-console", 2500, `{}`)
	voidCharge, voidID := e.stuckOperation(t, chargeonce.KindCancel, "vd-console", 1500, ``)
	c := e.console(t)
	list := c.get(t, "/admin/")
	for _, want := range []string{
		`href="/admin/operations/` + opID + `"`, `href="/admin/operations/` + voidID + `"`, "of " + chargeID, "of " + voidCharge,
		`name="kind" value="capture">`, `name="kind" value="cancel">`, "capture sent, outcome unknown", "void sent, outcome unknown",
	} {
		if !strings.Contains(list, want) {
			t.Fatalf("the stuck list lacks %q:\n%s", want, list)
		}
	}
	if found := c.post(t, "/admin/search", url.Values{"charge_id": {opID}}); !strings.Contains(found, `id="timeline"`) || !strings.Contains(found, opID) {
		t.Fatalf("searching by the capture's id:\n%s", found)
	}
	if cp := c.get(t, "/admin/charges/"+chargeID); !strings.Contains(cp, `id="operations"`) || !strings.Contains(cp, `href="/admin/operations/`+opID+`"`) {
		t.Fatalf("the authorized charge's page does not link its capture:\n%s", cp)
	}
	page := c.get(t, "/admin/operations/"+opID)
	if !strings.Contains(page, `id="timeline"`) || !strings.Contains(page, admin.CaptureSentNoAnswer) || !strings.Contains(page, `action="/admin/operations/`+opID+`/lookup"`) {
		t.Fatalf("the capture's page:\n%s", page)
	}
	look := c.post(t, "/admin/operations/"+opID+"/lookup", url.Values{})
	if !strings.Contains(look, "made this capture") || strings.Contains(look, "checked") {
		t.Fatalf("the look-first page:\n%s", look)
	}
	confirm := c.post(t, "/admin/operations/"+opID+"/resolve", url.Values{"status": {"failed"}, "reason": {"ticket 71"}})
	if !strings.Contains(confirm, `id="warning"`) || !strings.Contains(confirm, "Force failed") {
		t.Fatalf("confirming failed against the acquirer's capture: no loud warning nor force:\n%s", confirm)
	}
	confirm = c.post(t, "/admin/operations/"+opID+"/resolve", url.Values{"status": {"succeeded"}, "reason": {"ticket 71"}})
	if strings.Contains(confirm, `id="warning"`) || !strings.Contains(confirm, "Confirm: settle as succeeded") {
		t.Fatalf("confirming as the acquirer says:\n%s", confirm)
	}
	done := c.post(t, "/admin/operations/"+opID+"/resolve", url.Values{"status": {"succeeded"}, "reason": {"ticket 71"}, "confirm": {"1"}})
	if !strings.Contains(done, `id="status">succeeded`) || !strings.Contains(done, `id="charge-status">captured`) || !strings.Contains(done, "resolution") {
		t.Fatalf("after the resolution:\n%s", done)
	}
	bulk := c.post(t, "/admin/bulk", url.Values{"kind": {"cancel"}, "cause": {"void sent, outcome unknown"}, "reason": {"outage, ticket 72"}})
	if !strings.Contains(bulk, voidID) || !strings.Contains(bulk, "settled as <strong>succeeded</strong>") {
		t.Fatalf("bulk over the voids:\n%s", bulk)
	}
	if got := e.eventTypes(t, voidCharge); got[chargeonce.EventChargeCanceled] != 1 {
		t.Errorf("events of the voided charge: %v", got)
	}
	audit := c.get(t, "/admin/audit")
	if !strings.Contains(audit, `href="/admin/operations/`+opID+`"`) || !strings.Contains(audit, `href="/admin/operations/`+voidID+`"`) {
		t.Errorf("the audit trail does not link the operations:\n%s", audit)
	}
	if !strings.Contains(c.get(t, "/admin/"), "Nothing is processing") {
		t.Error("the stuck list is not empty after both resolutions")
	}
}

// TestStuckListNextPageAfterARefund: the console's stuck list pages by
// the last row's own id. A page ending on a refund led, before, to the
// page after the refund's charge (created before the refund), which holds
// that same refund again: the list never moved on.
func TestStuckListNextPageAfterARefund(t *testing.T) {
	t.Parallel()
	e := setup(t, "sqlite")
	_, first := e.stuckRefund(t, "rf-page-1")
	_, second := e.stuckRefund(t, "rf-page-2")
	c := e.console(t)
	next := regexp.MustCompile(`<a href="(/admin/\?[^"]*after=[^"]+)">Next page</a>`)
	row := regexp.MustCompile(`<a href="/admin/charges/[^"#]+#(re_[0-9a-f]+)">`)
	path := "/admin/?limit=1"
	var seen []string
	for range 4 {
		page := c.get(t, path)
		for _, m := range row.FindAllStringSubmatch(page, -1) {
			seen = append(seen, m[1])
		}
		m := next.FindStringSubmatch(page)
		if m == nil {
			break
		}
		path = strings.ReplaceAll(m[1], "&amp;", "&")
	}
	if want := []string{first, second}; !slices.Equal(seen, want) {
		t.Fatalf("pages of one stuck row showed %v, want %v", seen, want)
	}
}
