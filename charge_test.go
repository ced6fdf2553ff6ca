package chargeonce_test

import (
	"errors"
	"testing"

	"github.com/chargeonce/chargeonce"
)

func TestValidText(t *testing.T) {
	t.Parallel()
	for s, want := range map[string]bool{
		"": true, "café ☕ 🥐": true, "\ufffd": true, "tab\tnl\n": true, "\U0010FFFF": true,
		"a\x00b": false, "\x00": false, "\xff": false, "caf\xc3": false, "\xed\xa0\x80": false, "\xc0\xaf": false,
	} {
		if got := chargeonce.ValidText(s); got != want {
			t.Errorf("ValidText(%q) = %v, want %v", s, got, want)
		}
	}
}

// TestNormalizeRefusesTextNoStoreKeeps: a request built in Go (not decoded
// from JSON) gets the same refusal as one sent over HTTP.
func TestNormalizeRefusesTextNoStoreKeeps(t *testing.T) {
	t.Parallel()
	for _, desc := range []string{"a\x00b", "caf\xff", "\xed\xa0\x80"} {
		r := chargeonce.ChargeRequest{OrderID: 1, AmountCents: 1, PaymentToken: "tok_ok", Description: desc}
		err := r.Normalize()
		var e *chargeonce.Error
		if chargeonce.ErrorCode(err) != chargeonce.EINVALID || !errors.As(err, &e) || e.Field != "description" {
			t.Errorf("Normalize with description %q: %v, want EINVALID naming description", desc, err)
		}
	}
	ok := chargeonce.ChargeRequest{OrderID: 1, AmountCents: 1, PaymentToken: "tok_ok", Description: "two ☕"}
	if err := ok.Normalize(); err != nil {
		t.Fatalf("valid description refused: %v", err)
	}
}
