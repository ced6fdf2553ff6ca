package wire

import (
	"testing"

	"github.com/chargeonce/chargeonce"
)

// BenchmarkDecodeBody measures the strict decoding of a charge request, on
// every POST /v1/charges (the request itself is reused: only the decoding
// is measured).
func BenchmarkDecodeBody(b *testing.B) {
	const body = `{"order_id": 123, "amount_cents": 25000, "currency": "BRL", "payment_token": "tok_ok", "description": "order 123"}`
	raw := []byte(body)
	b.ReportAllocs()
	for b.Loop() {
		var req chargeonce.ChargeRequest
		if err := Decode(raw, &req); err != nil {
			b.Fatal(err)
		}
	}
}
