package chaos

import (
	"testing"

	"github.com/anishathalye/porcupine"
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
