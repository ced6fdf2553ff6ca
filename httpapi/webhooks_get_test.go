package httpapi_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/internal/apitest"
)

// TestWebhookEndpointGet: GET /v1/webhook_endpoints/{id} answers the
// merchant's endpoint as the list shows it (never its secret), and 404 for
// another merchant's or none, where it answered 405.
func TestWebhookEndpointGet(t *testing.T) {
	t.Parallel()
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			store := apitest.Store(t, kind)
			sim := apitest.Simulator(t, acquirer.Options{})
			base := startLikeServe(t, store, sim, engine.Options{AcquirerTimeout: 5 * time.Second, Lease: 10 * time.Second})
			do := caller(t, base)
			created := do("POST", "/v1/webhook_endpoints", `{"url":"https://hooks.example.com/get","description":"orders"}`, nil)
			var ep struct{ ID, Secret string }
			if created.Status != 201 || json.Unmarshal(created.Body, &ep) != nil {
				t.Fatalf("create: %d %s", created.Status, created.Body)
			}
			got := do("GET", "/v1/webhook_endpoints/"+ep.ID, "", nil)
			var one struct {
				ID, Object, URL, Description, Status string
				Secret                               *string
			}
			if got.Status != 200 || json.Unmarshal(got.Body, &one) != nil || one.ID != ep.ID || one.Object != "webhook_endpoint" ||
				one.URL != "https://hooks.example.com/get" || one.Description != "orders" || one.Status != "enabled" || one.Secret != nil {
				t.Fatalf("GET /v1/webhook_endpoints/%s: %d %s", ep.ID, got.Status, got.Body)
			}
			if strings.Contains(string(got.Body), "whsec_") {
				t.Fatalf("GET shows a secret: %s", got.Body)
			}
			other := map[string]string{"Authorization": "Bearer " + apitest.OtherAPIKey}
			for _, tc := range []struct {
				path    string
				headers map[string]string
			}{
				{"/v1/webhook_endpoints/" + ep.ID, other},
				{"/v1/webhook_endpoints/we_doesnotexist0000", nil},
				{"/v1/webhook_endpoints/" + strings.Repeat("x", 200), nil},
			} {
				if r := do("GET", tc.path, "", tc.headers); r.Status != 404 || !strings.Contains(string(r.Body), "not-found") {
					t.Errorf("GET %s: %d %s; want 404 not-found", tc.path, r.Status, r.Body)
				}
			}
		})
	}
}
