package idempotency

import (
	"testing"

	"github.com/chargeonce/chargeonce"
)

// TestFingerprintAllocatesOnce: every charge and every replay takes a
// fingerprint, and it costs one allocation, its string (base64's
// EncodeToString made it two: issue 38 asks replays to allocate no more
// than the release before).
func TestFingerprintAllocatesOnce(t *testing.T) {
	req := &chargeonce.ChargeRequest{OrderID: 123, AmountCents: 25000, Currency: "BRL", PaymentToken: "tok_ok", Description: "an order"}
	if n := testing.AllocsPerRun(100, func() { _ = Fingerprint("POST", "/v1/charges", req) }); n != 1 {
		t.Fatalf("Fingerprint allocates %.0f times; want 1", n)
	}
}
