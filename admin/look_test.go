package admin_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/admin"
	"github.com/chargeonce/chargeonce/internal/apitest"
)

// TestTimelineCollapsesRepeats: seven identical failed lookups in a row are
// one line, "7 × lookup", with their time span; a different line between
// them, or a reason, keeps lines apart. Outcomes read in human words.
func TestTimelineCollapsesRepeats(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 6, 5, 20, 59, 0, time.UTC)
	var tl []chargeonce.HistoryEntry
	tl = append(tl, chargeonce.HistoryEntry{Kind: chargeonce.HistoryInserted, Actor: "attempt", Outcome: "processing", At: t0})
	for i := range 7 {
		tl = append(tl, chargeonce.HistoryEntry{Kind: chargeonce.HistoryKind("lookup"), Actor: "recovery", Outcome: "error",
			Detail: "dial tcp 127.0.0.1:9: connect: connection refused", At: t0.Add(time.Duration(i) * 10 * time.Second)})
	}
	tl = append(tl, chargeonce.HistoryEntry{Kind: chargeonce.HistoryResolveRefused, Actor: "admin:alice", Outcome: "refused: wanted captured", Reason: "ticket 1", At: t0.Add(time.Minute)})
	rows := admin.Collapse(tl)
	if len(rows) != 3 || rows[1].Count != 7 || !rows[1].At.Equal(t0) || !rows[1].Last.Equal(t0.Add(time.Minute)) || rows[2].Count != 1 {
		t.Fatalf("collapsed: %+v", rows)
	}
	if h := admin.Human(rows[1].HistoryEntry); h != "the acquirer could not be reached" {
		t.Errorf("human words for a refused connection: %q", h)
	}
}

// TestTimelineShowsACaptureWithoutAnswer reproduces issue 34's item 1: an
// attempt that died mid-capture (its instance SIGKILLed) leaves its record
// and nothing else, and the timeline showed only "inserted … processing".
// It now says the capture was sent and no answer stored, from the record
// alone; the stuck list names that as the cause.
func TestTimelineShowsACaptureWithoutAnswer(t *testing.T) {
	t.Parallel()
	e := setup(t, "sqlite")
	// What an attempt commits before it calls the acquirer, and then dies:
	// its lease ends with nobody driving it (while it runs, the capture is
	// shown in flight).
	rec, inserted, err := e.store.KeyInsert(t.Context(), chargeonce.KeyInsertParams{
		Fingerprint: "fp_killed", Token: "tok_killed", Lease: 1500 * time.Millisecond,
		Charge: chargeonce.Charge{ID: "ch_killedmidcapture", MerchantID: "demo", IdempotencyKey: "killed-1", OrderID: 9, AmountCents: 1000, Currency: "KWD", PaymentToken: "tok_ok"},
	})
	if err != nil || !inserted {
		t.Fatalf("inserting: %v %v", inserted, err)
	}
	_, b := e.call(t, "GET", "/admin/v1/charges/"+rec.Charge.ID, aliceKey, nil)
	if !strings.Contains(string(b), admin.CaptureInFlight) {
		t.Errorf("history while the attempt's lease is live: %s; want its capture %q", b, admin.CaptureInFlight)
	}
	time.Sleep(time.Until(rec.Charge.CreatedAt.Add(1600 * time.Millisecond)))
	_, b = e.call(t, "GET", "/admin/v1/charges/"+rec.Charge.ID, aliceKey, nil)
	var d admin.ChargeDetailJSON
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	if len(d.History) != 2 || d.History[1].Kind != chargeonce.HistoryCapture || d.History[1].Outcome != admin.CaptureSentNoAnswer || !d.History[1].Derived {
		t.Fatalf("history of a charge whose attempt died mid-capture: %s", b)
	}
	if g := admin.Groups([]chargeonce.StuckCharge{{Charge: rec.Charge}}); len(g) != 1 || g[0].Cause != "capture sent, no answer stored" || g[0].Totals[0] != "1.000 KWD" {
		t.Errorf("groups: %+v", g)
	}
	// The common path still derives one capture, with its answer.
	r := apitest.Charge(t, e.api.URL, "fine-1", fmt.Sprintf(`{"order_id":%d,"amount_cents":100,"payment_token":"tok_ok"}`, e.orders.Add(1)))
	var ch struct{ ID string }
	_ = json.Unmarshal(r.Body, &ch)
	_, b = e.call(t, "GET", "/admin/v1/charges/"+ch.ID, aliceKey, nil)
	if strings.Contains(string(b), admin.CaptureSentNoAnswer) {
		t.Errorf("a charge settled on the common path: %s", b)
	}
}
