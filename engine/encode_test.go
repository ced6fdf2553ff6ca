package engine_test

import (
	"encoding/json"
	"maps"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/engine"
)

func sampleCharge() chargeonce.Charge {
	return chargeonce.Charge{
		ID: "ch_91ea5d691fee31e34dae6ee0", MerchantID: "demo", IdempotencyKey: "order-123-attempt-1",
		OrderID: 123, AmountCents: 25000, Currency: "BRL", PaymentToken: "tok_ok",
		Status: chargeonce.StatusCaptured, CreatedAt: time.Date(2026, 12, 2, 14, 56, 26, 0, time.UTC),
	}
}

// EncodeCharge is written by hand; it must say what encoding/json would.
func TestEncodeChargeIsTheChargeObject(t *testing.T) {
	t.Parallel()
	for name, mod := range map[string]func(c *chargeonce.Charge){
		"captured": func(c *chargeonce.Charge) {},
		"declined": func(c *chargeonce.Charge) { c.Status, c.DeclineCode = chargeonce.StatusDeclined, "insufficient_funds" },
		"escaped":  func(c *chargeonce.Charge) { c.ID, c.DeclineCode = `ch_"<&>\`+"\x01é", "a\"b" },
		"zone":     func(c *chargeonce.Charge) { c.CreatedAt = c.CreatedAt.In(time.FixedZone("BRT", -3*3600)) },
		"metadata": func(c *chargeonce.Charge) {
			c.Metadata = map[string]string{"order_ref": "A-1", "note": `"<é>"\` + "\x01", "": ""}
		},
	} {
		c := sampleCharge()
		mod(&c)
		var got chargeJSON
		if err := json.Unmarshal(engine.EncodeCharge(&c), &got); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		want := chargeJSON{ID: c.ID, OrderID: c.OrderID, AmountCents: c.AmountCents, Currency: c.Currency,
			Status: string(c.Status), CreatedAt: c.CreatedAt.UTC().Format(time.RFC3339)}
		if c.DeclineCode != "" {
			want.DeclineCode = &c.DeclineCode
		}
		if got.ID != want.ID || got.OrderID != want.OrderID || got.AmountCents != want.AmountCents || got.Currency != want.Currency ||
			got.Status != want.Status || got.CreatedAt != want.CreatedAt || (got.DeclineCode == nil) != (want.DeclineCode == nil) ||
			(got.DeclineCode != nil && *got.DeclineCode != *want.DeclineCode) || !maps.Equal(got.Metadata, c.Metadata) {
			t.Errorf("%s: got %+v, want %+v", name, got, want)
		}
	}
}

func TestFinalResponse(t *testing.T) {
	t.Parallel()
	c := sampleCharge()
	if r := engine.FinalResponse(&c); r.Status != 201 || string(r.Body) != string(engine.EncodeCharge(&c)) {
		t.Fatalf("captured: %d %s", r.Status, r.Body)
	}
	c.Status, c.DeclineCode = chargeonce.StatusDeclined, "insufficient_funds"
	r := engine.FinalResponse(&c)
	var p chargeonce.Problem
	if err := json.Unmarshal(r.Body, &p); err != nil || r.Status != 402 || p.Status != 402 ||
		p.Type != chargeonce.ProblemTypeBase+chargeonce.EDECLINED || p.ChargeID != c.ID || p.DeclineCode != "insufficient_funds" {
		t.Fatalf("declined: %d %s (%v)", r.Status, r.Body, err)
	}
}

// BenchmarkEncodeCharge measures the charge object every 201 (and 202, and
// GET) answer carries.
func BenchmarkEncodeCharge(b *testing.B) {
	c := sampleCharge()
	b.ReportAllocs()
	for b.Loop() {
		_ = engine.EncodeCharge(&c)
	}
}

// BenchmarkFinalResponseCaptured measures building the stored answer of a
// captured charge.
func BenchmarkFinalResponseCaptured(b *testing.B) {
	c := sampleCharge()
	b.ReportAllocs()
	for b.Loop() {
		_ = engine.FinalResponse(&c)
	}
}

// BenchmarkFinalResponseDeclined measures building the stored 402 problem.
func BenchmarkFinalResponseDeclined(b *testing.B) {
	c := sampleCharge()
	c.Status, c.DeclineCode = chargeonce.StatusDeclined, "insufficient_funds"
	b.ReportAllocs()
	for b.Loop() {
		_ = engine.FinalResponse(&c)
	}
}

// chargeJSON is the public charge object as a client decodes it.
type chargeJSON struct {
	ID          string            `json:"id"`
	OrderID     int64             `json:"order_id"`
	AmountCents int64             `json:"amount_cents"`
	Currency    string            `json:"currency"`
	Status      string            `json:"status"`
	DeclineCode *string           `json:"decline_code"`
	CreatedAt   string            `json:"created_at"`
	Metadata    map[string]string `json:"metadata"`
}
