package httpapi_test

import (
	"encoding/json"
	"maps"
	"testing"

	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/internal/apitest"
)

// TestMetadataAndLowerCaseCurrency: metadata is stored and returned with
// the charge (in the answer, its replay and GET), is part of "the same
// request" (other metadata under the key is a 422), and "brl" is BRL: the
// same request as "BRL", answered upper-case. On both stores.
func TestMetadataAndLowerCaseCurrency(t *testing.T) {
	t.Parallel()
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			f := setup(t, kind, engine.Options{}, acquirer.Options{})
			body := `{"order_id": 880001, "amount_cents": 100, "currency": "brl", "payment_token": "tok_ok", "metadata": {"order_ref": "A-1", "note": "é \"x\""}}`
			want := map[string]string{"order_ref": "A-1", "note": `é "x"`}
			var first []byte
			for i, b := range []string{body,
				// The same request: other order, spacing, and upper case.
				`{"metadata": {"note": "é \"x\"", "order_ref": "A-1"}, "currency": "BRL", "payment_token": "tok_ok", "amount_cents": 100, "order_id": 880001}`,
			} {
				r := apitest.Charge(t, f.inst.URL, "meta-1", b)
				if r.Status != 201 {
					t.Fatalf("attempt %d: status %d, body %s", i, r.Status, r.Body)
				}
				var ch struct {
					Currency string            `json:"currency"`
					Metadata map[string]string `json:"metadata"`
					ID       string            `json:"id"`
				}
				if err := json.Unmarshal(r.Body, &ch); err != nil {
					t.Fatal(err)
				}
				if ch.Currency != "BRL" || !maps.Equal(ch.Metadata, want) {
					t.Fatalf("attempt %d: currency %q metadata %v; body %s", i, ch.Currency, ch.Metadata, r.Body)
				}
				if i == 0 {
					first = r.Body
					g, err := apitest.Do(t, nil, "GET", f.inst.URL+"/v1/charges/"+ch.ID, nil, nil)
					if err != nil || g.Status != 200 || string(g.Body) != string(r.Body) {
						t.Fatalf("GET: %d %s (%v); want %s", g.Status, g.Body, err, r.Body)
					}
				} else if string(r.Body) != string(first) || r.Header.Get("Idempotent-Replayed") != "true" {
					t.Fatalf("replay %s (replayed %q); want %s", r.Body, r.Header.Get("Idempotent-Replayed"), first)
				}
			}
			r := apitest.Charge(t, f.inst.URL, "meta-1", `{"order_id": 880001, "amount_cents": 100, "payment_token": "tok_ok", "metadata": {"order_ref": "A-2"}}`)
			wantProblemNamed(t, "other metadata", r, 422, "idempotency-key-reused")
			r = apitest.Charge(t, f.inst.URL, "meta-1", `{"order_id": 880001, "amount_cents": 100, "payment_token": "tok_ok"}`)
			wantProblemNamed(t, "no metadata", r, 422, "idempotency-key-reused")
		})
	}
}
