package httpapi_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/internal/apitest"
)

// TestHostileInput sends text no store can keep faithfully — NUL, invalid
// UTF-8, lone surrogate escapes — in the body, the path and the query, on
// both stores: each is a 400 naming the field (or a 404 for an id that
// cannot be a charge's), never a 500, never a silent rewrite to U+FFFD, and
// nothing is stored or captured.
func TestHostileInput(t *testing.T) {
	t.Parallel()
	const order = 777002
	withDesc := func(raw string) string {
		return fmt.Sprintf(`{"order_id": %d, "amount_cents": 100, "payment_token": "tok_ok", "description": "%s"}`, order, raw)
	}
	posts := []struct {
		name  string
		body  string
		field string
	}{
		{"NUL escape in description", withDesc(`a\u0000b`), "description"},
		{"only a NUL escape", withDesc(`\u0000`), "description"},
		{"raw NUL byte in description", withDesc("a\x00b"), "description"},
		{"invalid UTF-8 byte in description", withDesc("caf\xff"), "description"},
		{"truncated UTF-8 in description", withDesc("caf\xc3"), "description"},
		{"UTF-8-encoded surrogate in description", withDesc("\xed\xa0\x80"), "description"},
		{"overlong UTF-8 in description", withDesc("\xc0\xaf"), "description"},
		{"lone high surrogate escape", withDesc(`a\ud800b`), "description"},
		{"lone low surrogate escape", withDesc(`\udc00`), "description"},
		{"upper-case lone surrogate escape", withDesc(`\uDBFF`), "description"},
		{"high surrogate at the end", withDesc(`x\ud83e`), "description"},
		{"reversed surrogate pair", withDesc(`\udd50\ud83e`), "description"},
		{"high surrogate then a non-surrogate escape", withDesc(`\ud83e\u0041`), "description"},
		{"two high surrogates", withDesc(`\ud83e\ud83e\udd50`), "description"},
		{"NUL in payment_token", fmt.Sprintf(`{"order_id": %d, "amount_cents": 100, "payment_token": "tok_ok\u0000"}`, order), "payment_token"},
		{"lone surrogate in payment_token", fmt.Sprintf(`{"order_id": %d, "amount_cents": 100, "payment_token": "tok\udfff"}`, order), "payment_token"},
		{"NUL in currency", fmt.Sprintf(`{"order_id": %d, "amount_cents": 100, "payment_token": "tok_ok", "currency": "BR\u0000"}`, order), "currency"},
		{"invalid UTF-8 in a field name", fmt.Sprintf("{\"order_id\": %d, \"amount_cents\": 100, \"payment_token\": \"tok_ok\", \"descr\xffiption\": \"x\"}", order), ""},
		{"invalid UTF-8 outside strings", fmt.Sprintf("{\"order_id\": %d, \"amount_cents\": 100, \"payment_token\": \"tok_ok\"}\xff", order), ""},
	}
	gets := []struct {
		name, path string
		status     int
		slug       string
	}{
		{"percent-encoded NUL id", "/v1/charges/%00", 404, "not-found"},
		{"percent-encoded 0xFF id", "/v1/charges/%FF", 404, "not-found"},
		{"NUL inside an id", "/v1/charges/ch_0123%00abcd", 404, "not-found"},
		{"invalid UTF-8 id", "/v1/charges/%C3%28", 404, "not-found"},
		{"UTF-8 surrogate id", "/v1/charges/%ED%A0%80", 404, "not-found"},
		{"non-ASCII id", "/v1/charges/caf%C3%A9", 404, "not-found"},
		{"space in id", "/v1/charges/ch%20x", 404, "not-found"},
		{"very long id", "/v1/charges/ch_" + strings.Repeat("a", 5000), 404, "not-found"},
		{"NUL order_id", "/v1/charges?order_id=%00", 400, "validation-failed"},
		{"order_id with a NUL", "/v1/charges?order_id=1%00", 400, "validation-failed"},
		{"0xFF order_id", "/v1/charges?order_id=%FF", 400, "validation-failed"},
		{"bad escape in query", "/v1/charges?order_id=%zz", 400, "validation-failed"},
		{"NUL in an unknown query parameter", "/v1/charges?order_id=1&x=%00", 400, "validation-failed"},
	}
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			f := setup(t, kind, engine.Options{}, acquirer.Options{})
			for i, tc := range posts {
				key := fmt.Sprintf("hostile-%d", i)
				r, err := apitest.Do(t, nil, "POST", f.inst.URL+"/v1/charges", []byte(tc.body), map[string]string{"Idempotency-Key": key})
				if err != nil {
					t.Fatalf("%s: %v", tc.name, err)
				}
				p := wantProblemNamed(t, tc.name, r, 400, "validation-failed")
				if p.Field != tc.field {
					t.Errorf("%s: problem field = %q, want %q (%s)", tc.name, p.Field, tc.field, p.Detail)
				}
				assertNothingStored(t, f, tc.name, key, order)
			}
			for _, tc := range gets {
				r, err := apitest.Do(t, nil, "GET", f.inst.URL+tc.path, nil, nil)
				if err != nil {
					t.Fatalf("%s: %v", tc.name, err)
				}
				if tc.status == 200 {
					if r.Status != 200 {
						t.Fatalf("%s: status %d, want 200; body %s", tc.name, r.Status, r.Body)
					}
					continue
				}
				wantProblemNamed(t, tc.name, r, tc.status, tc.slug)
			}
			if st := f.sim.Stats(); st.CaptureRequests != 0 {
				t.Fatalf("hostile input reached the acquirer (%d requests)", st.CaptureRequests)
			}

			// A valid surrogate pair is an emoji outside the BMP: accepted,
			// and stored as exactly that character.
			r := apitest.Charge(t, f.inst.URL, "emoji", withDesc(`two \u2615 and a \ud83e\udd50`))
			if r.Status != 201 {
				t.Fatalf("valid surrogate pair: status %d, body %s", r.Status, r.Body)
			}
			var ch struct{ ID string }
			if err := json.Unmarshal(r.Body, &ch); err != nil {
				t.Fatal(err)
			}
			got, err := f.store.ChargeGet(t.Context(), "demo", ch.ID)
			if err != nil || got.Description != "two ☕ and a 🥐" {
				t.Fatalf("stored description %q (%v), want %q", got.Description, err, "two ☕ and a 🥐")
			}
		})
	}
}
