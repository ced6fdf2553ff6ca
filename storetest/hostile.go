package storetest

import (
	"errors"
	"testing"

	"github.com/chargeonce/chargeonce"
)

// testHostile holds the cases of hostile text reaching a store (run by Run
// as one entry, on one store).
func testHostile(t *testing.T, s chargeonce.Store) {
	t.Run("ReadsNotFound", func(t *testing.T) { testHostileReadsNotFound(t, s) })
	t.Run("InsertRefused", func(t *testing.T) { testHostileInsertRefused(t, s) })
	t.Run("UnicodeRoundTrips", func(t *testing.T) { testUnicodeRoundTrips(t, s) })
}

// hostileStrings are strings a client can smuggle past a careless edge: a
// NUL byte (PostgreSQL's text cannot hold it, SQLite's can), invalid UTF-8
// (PostgreSQL refuses it, SQLite stores the bytes), a UTF-16 surrogate
// encoded as UTF-8 (what a lone "\ud800" escape becomes in a sloppy
// decoder), and the percent-encodings a path may carry before unescaping.
// The HTTP edge refuses all of them; the store must still answer them the
// same way on every implementation if they ever reach it.
var hostileStrings = map[string]string{
	"nul":               "a\x00b",
	"only-nul":          "\x00",
	"invalid-utf8":      "\xff",
	"truncated-utf8":    "caf\xc3",
	"bad-continuation":  "a\xc3(b",
	"utf8-surrogate":    "\xed\xa0\x80",
	"overlong-slash":    "\xc0\xaf",
	"nul-after-valid":   "ch_0123456789ab\x00",
	"percent-nul":       "%00",
	"percent-ff":        "%FF",
	"sql-quote":         "ch_' OR '1'='1",
	"very-long-invalid": string(make([]byte, 300)),
}

// testHostileReadsNotFound: looking up a key, a charge or an order with a
// string that cannot have been stored is "not found" (or an empty list),
// never an internal error, on both stores — the same answer the store gives
// for any other unknown id.
func testHostileReadsNotFound(t *testing.T, s chargeonce.Store) {
	p := newIntent("m1", "key-1")
	insert(t, s, p)
	for name, bad := range hostileStrings {
		_, err := s.ChargeGet(t.Context(), "m1", bad)
		wantCode(t, name+": ChargeGet with a hostile id", err, chargeonce.ENOTFOUND)
		_, err = s.ChargeGet(t.Context(), bad, p.Charge.ID)
		wantCode(t, name+": ChargeGet with a hostile merchant", err, chargeonce.ENOTFOUND)
		_, err = s.KeyGet(t.Context(), "m1", bad)
		wantCode(t, name+": KeyGet with a hostile key", err, chargeonce.ENOTFOUND)
		_, err = s.KeyGet(t.Context(), bad, "key-1")
		wantCode(t, name+": KeyGet with a hostile merchant", err, chargeonce.ENOTFOUND)
		charges, err := s.ChargesListByOrder(t.Context(), bad, p.Charge.OrderID)
		if err != nil || len(charges) != 0 {
			t.Fatalf("%s: ChargesListByOrder with a hostile merchant = %v, err %v; want none and no error", name, charges, err)
		}
	}
	// The good record is untouched and still readable.
	get(t, s, "m1", "key-1")
}

// testHostileInsertRefused: a record whose text cannot be stored faithfully
// by every store is refused with EINVALID naming the field, and nothing is
// left behind. Without this PostgreSQL answered an internal error while
// SQLite stored the bytes: the same request got a 500 on one store and a
// capture on the other.
func testHostileInsertRefused(t *testing.T, s chargeonce.Store) {
	fields := []struct {
		field string
		set   func(p *chargeonce.KeyInsertParams, v string)
	}{
		{"description", func(p *chargeonce.KeyInsertParams, v string) { p.Charge.Description = v }},
		{"payment_token", func(p *chargeonce.KeyInsertParams, v string) { p.Charge.PaymentToken = v }},
		{"currency", func(p *chargeonce.KeyInsertParams, v string) { p.Charge.Currency = v }},
		{"idempotency_key", func(p *chargeonce.KeyInsertParams, v string) { p.Charge.IdempotencyKey = v }},
		{"merchant_id", func(p *chargeonce.KeyInsertParams, v string) { p.Charge.MerchantID = v }},
	}
	for name, bad := range hostileStrings {
		if chargeonce.ValidText(bad) {
			continue // storable text (a percent sign, a quote): not refused
		}
		for _, f := range fields {
			p := newIntent("m1", "hostile-"+name+"-"+f.field)
			p.Charge.OrderID = 4242
			f.set(&p, bad)
			_, inserted, err := s.KeyInsert(t.Context(), p)
			if inserted {
				t.Fatalf("%s in %s: KeyInsert stored it", name, f.field)
			}
			wantCode(t, name+" in "+f.field+": KeyInsert", err, chargeonce.EINVALID)
			var e *chargeonce.Error
			if errors.As(err, &e) && e.Field != f.field {
				t.Fatalf("%s in %s: KeyInsert error names field %q (%v)", name, f.field, e.Field, err)
			}
			_, err = s.KeyGet(t.Context(), "m1", "hostile-"+name+"-"+f.field)
			wantCode(t, name+" in "+f.field+": KeyGet after a refused insert", err, chargeonce.ENOTFOUND)
			_, err = s.ChargeGet(t.Context(), "m1", p.Charge.ID)
			wantCode(t, name+" in "+f.field+": ChargeGet after a refused insert", err, chargeonce.ENOTFOUND)
		}
	}
	if charges, err := s.ChargesListByOrder(t.Context(), "m1", 4242); err != nil || len(charges) != 0 {
		t.Fatalf("refused inserts left charges behind: %v, err %v", charges, err)
	}
}

// testUnicodeRoundTrips: valid text a client may legitimately send —
// accents, emoji (outside the BMP, a surrogate pair in JSON), line
// separators, the replacement character itself, other control characters
// — is stored and read back byte for byte by every store.
func testUnicodeRoundTrips(t *testing.T, s chargeonce.Store) {
	for name, text := range map[string]string{
		"accents":     "café à la crème",
		"emoji":       "two ☕ and a 🥐",
		"separators":  "line\u2028para\u2029end",
		"replacement": "\ufffd already replaced",
		"controls":    "tab\there\r\nbell\x07 del\x7f",
		"cjk":         "支付一次",
		"max-rune":    "\U0010FFFF",
	} {
		p := newIntent("m1", "unicode-"+name)
		p.Charge.Description = text
		insert(t, s, p)
		if got := get(t, s, "m1", "unicode-"+name); got.Charge.Description != text {
			t.Fatalf("%s: KeyGet description = %q, want %q", name, got.Charge.Description, text)
		}
		ch, err := s.ChargeGet(t.Context(), "m1", p.Charge.ID)
		if err != nil || ch.Description != text {
			t.Fatalf("%s: ChargeGet description = %q, err %v; want %q", name, ch.Description, err, text)
		}
	}
}
