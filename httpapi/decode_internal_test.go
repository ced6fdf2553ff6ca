package httpapi

import (
	"io"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/chargeonce/chargeonce"
)

// BenchmarkDecodeBody measures the strict decoding of a charge request, on
// every POST /v1/charges (the request itself is reused: only the decoding
// is measured).
func BenchmarkDecodeBody(b *testing.B) {
	const body = `{"order_id": 123, "amount_cents": 25000, "currency": "BRL", "payment_token": "tok_ok", "description": "order 123"}`
	r := httptest.NewRequest("POST", "/v1/charges", nil)
	r.ContentLength = int64(len(body))
	rd := strings.NewReader(body)
	w := httptest.NewRecorder()
	b.ReportAllocs()
	for b.Loop() {
		rd.Reset(body)
		r.Body = io.NopCloser(rd)
		var req chargeonce.ChargeRequest
		if err := decodeBody(w, r, &req); err != nil {
			b.Fatal(err)
		}
	}
}
