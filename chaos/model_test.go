package chaos

import (
	"fmt"
	"strings"
	"testing"

	"github.com/anishathalye/porcupine"

	"github.com/chargeonce/chargeonce"
)

// TestModel checks the checker's model on small histories: what the
// contract allows passes, and each kind of anomaly fails.
func TestModel(t *testing.T) {
	t.Parallel()
	a := input{Kind: opCharge, Variant: 1, Via: "http"}
	b := input{Kind: opCharge, Variant: 2, Via: "http"}
	ledger := input{Kind: opLedger, Via: "acquirer"}
	captured := output{Kind: outFinal, Status: 201, Body: `{"id":"ch_1","status":"captured"}`}
	declined := output{Kind: outFinal, Status: 402, Body: `{"charge_id":"ch_1","decline_code":"insufficient_funds"}`}
	reused := output{Kind: outReused, Status: 422}
	unknown := output{Kind: outUnknown}
	op := func(in input, out output, call, ret int64) porcupine.Operation {
		return porcupine.Operation{Input: in, Output: out, Call: call, Return: ret}
	}
	for _, tc := range []struct {
		name string
		ops  []porcupine.Operation
		ok   bool
	}{
		{"replays of one answer, one capture", []porcupine.Operation{
			op(a, captured, 0, 10), op(a, captured, 5, 20), op(ledger, output{Kind: opLedger, Captured: 1}, 30, 31)}, true},
		{"another request gets 422", []porcupine.Operation{
			op(a, captured, 0, 10), op(b, reused, 11, 12), op(ledger, output{Kind: opLedger, Captured: 1}, 30, 31)}, true},
		{"the other request came first and won", []porcupine.Operation{
			op(b, captured, 0, 10), op(a, reused, 11, 12), op(ledger, output{Kind: opLedger, Captured: 1}, 30, 31)}, true},
		{"an unknown call may have taken the key", []porcupine.Operation{
			op(a, unknown, 0, 10), op(b, reused, 11, 12), op(ledger, output{Kind: opLedger, Captured: 1}, 30, 31)}, true},
		{"declined, nothing captured", []porcupine.Operation{
			op(a, declined, 0, 10), op(ledger, output{Kind: opLedger, Declined: 1}, 30, 31)}, true},
		{"captured and declined", []porcupine.Operation{
			op(a, captured, 0, 10), op(a, declined, 11, 20)}, false},
		{"two different bodies", []porcupine.Operation{
			op(a, captured, 0, 10), op(a, output{Kind: outFinal, Status: 201, Body: `{"id":"ch_2","status":"captured"}`}, 11, 20)}, false},
		{"422 for the same request", []porcupine.Operation{
			op(a, captured, 0, 10), op(a, reused, 11, 12)}, false},
		{"422 with nobody owning the key", []porcupine.Operation{op(b, reused, 0, 1)}, false},
		{"another answer for a valid request", []porcupine.Operation{
			op(a, output{Kind: outOther, Status: 400}, 0, 1)}, false},
		{"captured twice", []porcupine.Operation{
			op(a, captured, 0, 10), op(ledger, output{Kind: opLedger, Captured: 2}, 30, 31)}, false},
		{"declined but captured", []porcupine.Operation{
			op(a, declined, 0, 10), op(ledger, output{Kind: opLedger, Captured: 1, Declined: 1}, 30, 31)}, false},
		{"a capture nobody asked for", []porcupine.Operation{
			op(ledger, output{Kind: opLedger, Captured: 1}, 30, 31)}, false},
	} {
		if got := porcupine.CheckOperations(model.ToModel(), tc.ops); got != tc.ok {
			t.Errorf("%s: linearizable = %v, want %v", tc.name, got, tc.ok)
		}
	}
}

// TestRefundChecker checks checkRefunds on small histories: what the
// contract allows passes, and each kind of refund anomaly is reported.
func TestRefundChecker(t *testing.T) {
	t.Parallel()
	work := &refundWork{Intent: 1, ChargeID: "ch_1", Captured: 2500, Keys: []refundKey{{"k1", 1000}, {"k2", 1200}, {"k3", 700}}}
	body := func(id string, cents int64, status string) string {
		return fmt.Sprintf(`{"id":%q,"charge_id":"ch_1","amount_cents":%d,"currency":"BRL","status":%q}`, id, cents, status)
	}
	ok := func(key, id string, cents int64) refundRecord {
		return refundRecord{ChargeID: "ch_1", Key: key, Amount: cents, Out: output{Kind: outFinal, Status: 201, Body: body(id, cents, "succeeded")}}
	}
	refused := refundRecord{ChargeID: "ch_1", Key: "k3", Amount: 700, Out: output{Kind: outRefused, Status: 400}}
	entry := func(ref string, cents int64, status string) chargeonce.LedgerEntry {
		return chargeonce.LedgerEntry{Kind: chargeonce.LedgerRefund, Reference: ref, ChargeReference: "ch_1", AmountCents: cents, Status: status}
	}
	good := []refundRecord{ok("k1", "re_1", 1000), ok("k1", "re_1", 1000), ok("k2", "re_2", 1200), refused}
	goodLedger := []chargeonce.LedgerEntry{entry("re_1", 1000, "succeeded"), entry("re_2", 1200, "succeeded")}
	for _, tc := range []struct {
		name   string
		recs   []refundRecord
		ledger []chargeonce.LedgerEntry
		want   string // "" for none
	}{
		{"two refunds and a refusal", good, goodLedger, ""},
		{"an unknown call whose refund settled", []refundRecord{ok("k1", "re_1", 1000), {ChargeID: "ch_1", Key: "k2", Out: output{Kind: outUnknown}}},
			goodLedger, ""},
		{"a key answered two refunds", append(good[:2:2], ok("k1", "re_9", 1000)), goodLedger, "two different refunds"},
		{"acknowledged past the capture", []refundRecord{ok("k1", "re_1", 1000), ok("k2", "re_2", 1200), ok("k3", "re_3", 700)},
			append(goodLedger, entry("re_3", 700, "succeeded")), "acknowledged 2900 refunded"},
		{"a refund in the ledger twice", good, append(goodLedger, entry("re_1", 1000, "succeeded")), "reached the acquirer's ledger 2 times"},
		{"an acknowledged refund missing from the ledger", good, goodLedger[:1], "was acknowledged succeeded"},
		{"a refund nobody was answered with", good, append(goodLedger, entry("re_x", 100, "succeeded")), "which no key was answered with"},
		// Issue 47: an operator resolved a refund failed while its
		// request was still on its way; the merchant's retry replayed
		// "failed", and the request then landed and refunded.
		{"a refund resolved failed that landed late", []refundRecord{ok("k1", "re_1", 1000),
			{ChargeID: "ch_1", Key: "k2", Amount: 1200, Out: output{Kind: outFinal, Status: 201, Body: body("re_2", 1200, "failed")}}},
			goodLedger, "was answered not succeeded but the acquirer refunded it"},
		{"an answer a valid refund never gets", append(good[:3:3], refundRecord{ChargeID: "ch_1", Key: "k3", Out: output{Kind: outOther, Status: 500}}),
			goodLedger, "never gets"},
	} {
		got := checkRefunds([]*refundWork{work}, tc.recs, tc.ledger)
		switch {
		case tc.want == "" && len(got) > 0:
			t.Errorf("%s: anomalies %q; want none", tc.name, got)
		case tc.want != "" && !strings.Contains(strings.Join(got, "\n"), tc.want):
			t.Errorf("%s: anomalies %q; want one saying %q", tc.name, got, tc.want)
		}
	}
}
