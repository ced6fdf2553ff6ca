package wire_test

import (
	"encoding/json"
	"maps"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/httpapi"
	"github.com/chargeonce/chargeonce/idempotency"
	"github.com/chargeonce/chargeonce/wire"
)

// FuzzDecodeChargeRequest: whatever the body, DecodeChargeRequest answers a
// valid request or a client error (400 or 413, never a 500); what it
// accepts is valid text that every store keeps, was valid UTF-8 on the
// wire, and survives a round trip through JSON with the same fingerprint.
// What it accepts is also what a case-insensitive, last-duplicate-wins
// reader (encoding/json) sees: no two readers disagree on a request that
// is charged.
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
		`{"order_id": 1, "amount_cents": 25000, "payment_token": "t", "Amount_Cents": 1}`,
		`{"order_id": 1, "AMOUNT_CENTS": 7, "payment_token": "t"}`,
		`{"order_id": 1, "amount_cents": 1, "amount_cents": 999999, "payment_token": "t"}`,
		`{"order_id": 1, "amount_cents": 1, "amount_c\u0065nts": 999999, "payment_token": "t"}`,
		`{"order_id": 1, "amount_cents": 1, "payment_token": "t", "metadata": {"a": "1", "b": "\u00e9"}}`,
		`{"order_id": 1, "amount_cents": 1, "payment_token": "t", "metadata": {"a": "1", "a": "2"}}`,
		`{"order_id": 1, "amount_cents": 1, "payment_token": "t", "metadata": {"a": "1", "A": "2"}}`,
		`{"order_id": 1, "amount_cents": 1, "payment_token": "t", "metadata": {"a": 1}}`,
		`{"order_id": 1, "amount_cents": 1, "payment_token": "t", "metadata": {"": "x"}}`,
		`{"order_id": 1, "amount_cents": 1, "payment_token": "t", "metadata": {}}`,
		`{"order_id": 1, "amount_cents": 1, "payment_token": "t", "metadata": null}`,
		`{"order_id": 1, "amount_cents": 1, "payment_token": "t", "metadata": {"k": "\u0000"}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := wire.DecodeChargeRequest(body)
		if err != nil {
			code := chargeonce.ErrorCode(err)
			if code != chargeonce.EINVALID && code != chargeonce.ETOOLARGE {
				t.Fatalf("body %q: error code %s (%v)", body, code, err)
			}
			if status, _ := httpapi.Problem(err); status >= 500 {
				t.Fatalf("body %q: answered %d", body, status)
			}
			return
		}
		if !utf8.Valid(body) {
			t.Fatalf("accepted a body that is not valid UTF-8: %q", body)
		}
		texts := map[string]string{"currency": req.Currency, "payment_token": req.PaymentToken, "description": req.Description}
		for k, v := range req.Metadata {
			texts["metadata key "+k] = k
			texts["metadata value "+k] = v
		}
		for name, s := range texts {
			if !chargeonce.ValidText(s) {
				t.Fatalf("body %q: accepted %s %q that no store keeps", body, name, s)
			}
		}
		if req.Metadata != nil && len(req.Metadata) == 0 {
			t.Fatalf("body %q: accepted empty metadata that is not nil", body)
		}
		// encoding/json, the lenient reader a front-end may use, must
		// read the same request.
		var lenient chargeonce.ChargeRequest
		if err := json.Unmarshal(body, &lenient); err == nil && lenient.Normalize() == nil && !equal(lenient, req) {
			t.Fatalf("body %q: encoding/json reads %+v, the service charges %+v", body, lenient, req)
		}
		if strings.ContainsRune(req.Description, utf8.RuneError) && !strings.Contains(string(body), "\ufffd") && !strings.Contains(strings.ToLower(string(body)), `\ufffd`) {
			t.Fatalf("body %q: description %q holds U+FFFD the client never sent (a silent rewrite)", body, req.Description)
		}
		if req.OrderID <= 0 || req.AmountCents <= 0 || req.PaymentToken == "" || req.Currency == "" {
			t.Fatalf("body %q: accepted %+v", body, req)
		}
		again := req
		if err := again.Normalize(); err != nil || !equal(again, req) {
			t.Fatalf("body %q: an accepted request does not normalize to itself: %+v, %v", body, again, err)
		}
		re, err := json.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		back, err := wire.DecodeChargeRequest(re)
		if err != nil || !equal(back, req) {
			t.Fatalf("body %q: round trip %s decodes to %+v, %v; want %+v", body, re, back, err, req)
		}
		if idempotency.Fingerprint("POST", "/v1/charges", &back) != idempotency.Fingerprint("POST", "/v1/charges", &req) {
			t.Fatalf("body %q: the round trip changed the fingerprint", body)
		}
	})
}

func equal(a, b chargeonce.ChargeRequest) bool {
	return a.OrderID == b.OrderID && a.AmountCents == b.AmountCents && a.Currency == b.Currency &&
		a.PaymentToken == b.PaymentToken && a.Description == b.Description && maps.Equal(a.Metadata, b.Metadata)
}

// FuzzDecodeOperationAmount: whatever the body of a refund or a capture,
// the decoders answer a request or a client error (400 or 413), and an
// accepted request's amount is what the body says: all of it (0) only when
// the body names no amount_cents, a positive amount otherwise (issue 47.9:
// {"amount_cents": 0} meant all of it).
func FuzzDecodeOperationAmount(f *testing.F) {
	for _, s := range []string{
		``, ` `, `{}`, `{"amount_cents": 0}`, `{"amount_cents": -0}`, `{"amount_cents": 0.0}`, `{"amount_cents": null}`,
		`{"amount_cents": 1}`, `{"amount_cents": -5}`, `{"amount_cents": 9223372036854775807}`, `{"amount_c\u0065nts": 0}`,
		`{"reason": "x"}`, `{"amount_cents": 0, "reason": "x"}`, `{"Amount_Cents": 0}`, `{"amount_cents": 1, "amount_cents": 0}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		refund, rerr := wire.DecodeRefundRequest(body)
		capture, cerr := wire.DecodeCaptureBody(body)
		for _, c := range []struct {
			what   string
			amount int64
			err    error
		}{{"refund", refund.AmountCents, rerr}, {"capture", capture.AmountCents, cerr}} {
			if c.err != nil {
				if code := chargeonce.ErrorCode(c.err); code != chargeonce.EINVALID && code != chargeonce.ETOOLARGE {
					t.Fatalf("%s %q: %v (code %s); want a client error", c.what, body, c.err, code)
				}
				continue
			}
			if strings.TrimSpace(string(body)) == "" {
				if c.amount != 0 {
					t.Fatalf("%s of an empty body: amount %d, want 0 (all of it)", c.what, c.amount)
				}
				continue
			}
			var fields map[string]json.RawMessage
			if err := json.Unmarshal(body, &fields); err != nil {
				t.Fatalf("%s %q accepted, but encoding/json cannot read it: %v", c.what, body, err)
			}
			raw, named := fields["amount_cents"]
			switch {
			case !named && c.amount != 0:
				t.Fatalf("%s %q names no amount_cents, yet its amount is %d", c.what, body, c.amount)
			case named && c.amount <= 0:
				t.Fatalf("%s %q names amount_cents %s, accepted as %d: all of it", c.what, body, raw, c.amount)
			}
		}
	})
}
