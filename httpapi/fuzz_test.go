package httpapi

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/idempotency"
)

// FuzzDecodeChargeRequest: whatever the body, DecodeChargeRequest answers a
// valid request or a client error (400 or 413, never a 500); what it
// accepts is valid text that every store keeps, was valid UTF-8 on the
// wire, and survives a round trip through JSON with the same fingerprint.
func FuzzDecodeChargeRequest(f *testing.F) {
	for _, s := range []string{
		`{"order_id": 123, "amount_cents": 25000, "currency": "BRL", "payment_token": "tok_ok", "description": "optional"}`,
		`{"order_id": 1, "amount_cents": 1, "payment_token": "t"}`,
		`{"order_id": 1, "amount_cents": 1, "payment_token": "t", "description": "a\u0000b"}`,
		`{"order_id": 1, "amount_cents": 1, "payment_token": "t", "description": "\ud800"}`,
		`{"order_id": 1, "amount_cents": 1, "payment_token": "t", "description": "\ud83e\udd50"}`,
		`{"order_id": 1, "amount_cents": 1, "payment_token": "t", "description": "\udd50\ud83e"}`,
		"{\"order_id\": 1, \"amount_cents\": 1, \"payment_token\": \"t\", \"description\": \"caf\xff\"}",
		"{\"order_id\": 1, \"amount_cents\": 1, \"payment_token\": \"t\", \"description\": \"\xed\xa0\x80\"}",
		`{"order_id": 1, "amount_cents": 1, "payment_token": "t", "description": "\\u0000"}`,
		`{"order_id": 1, "amount_cents": 1, "payment_token": "t", "descr\u0069ption": "x"}`,
		`{"order_id": 1, "amount_cents": 1, "payment_token": "t", "description": "\u2028\ufffd"}`,
		`{"order_id": 1, "amount_cents": 1.0, "payment_token": "t"}`,
		`{"order_id": 9223372036854775808, "amount_cents": 1, "payment_token": "t"}`,
		`{"order_id": 1, "amount_cents": 1, "payment_token": "t", "extra": {"a": ["\u0000"]}}`,
		`{"order_id": 1, "amount_cents": 1, "payment_token": "t"} {}`,
		`{"order_id": 1,`, `[1,2]`, `null`, ``, `"\u0000"`, `{"\u0000": 1}`, "\xff",
		`{"order_id": 1, "amount_cents": 1, "payment_token": "t", "currency": "usd"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := DecodeChargeRequest(body)
		if err != nil {
			code := chargeonce.ErrorCode(err)
			if code != chargeonce.EINVALID && code != chargeonce.ETOOLARGE {
				t.Fatalf("body %q: error code %s (%v)", body, code, err)
			}
			if status, _ := Problem(err); status >= 500 {
				t.Fatalf("body %q: answered %d", body, status)
			}
			return
		}
		if !utf8.Valid(body) {
			t.Fatalf("accepted a body that is not valid UTF-8: %q", body)
		}
		for name, s := range map[string]string{"currency": req.Currency, "payment_token": req.PaymentToken, "description": req.Description} {
			if !chargeonce.ValidText(s) {
				t.Fatalf("body %q: accepted %s %q that no store keeps", body, name, s)
			}
		}
		if strings.ContainsRune(req.Description, utf8.RuneError) && !strings.Contains(string(body), "\ufffd") && !strings.Contains(strings.ToLower(string(body)), `\ufffd`) {
			t.Fatalf("body %q: description %q holds U+FFFD the client never sent (a silent rewrite)", body, req.Description)
		}
		if req.OrderID <= 0 || req.AmountCents <= 0 || req.PaymentToken == "" || req.Currency == "" {
			t.Fatalf("body %q: accepted %+v", body, req)
		}
		again := req
		if err := again.Normalize(); err != nil || again != req {
			t.Fatalf("body %q: an accepted request does not normalize to itself: %+v, %v", body, again, err)
		}
		re, err := json.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		back, err := DecodeChargeRequest(re)
		if err != nil || back != req {
			t.Fatalf("body %q: round trip %s decodes to %+v, %v; want %+v", body, re, back, err, req)
		}
		if idempotency.Fingerprint("POST", "/v1/charges", &back) != idempotency.Fingerprint("POST", "/v1/charges", &req) {
			t.Fatalf("body %q: the round trip changed the fingerprint", body)
		}
	})
}
