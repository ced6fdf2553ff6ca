package httpapi_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/internal/apitest"
)

// TestWebhookEndpointsAPI: the secret is shown on creation and rotation and
// never in the list; another merchant sees, rotates and deletes nothing;
// every mistake in the body is a 400 naming its field.
func TestWebhookEndpointsAPI(t *testing.T) {
	t.Parallel()
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			store := apitest.Store(t, kind)
			sim := apitest.Simulator(t, acquirer.Options{})
			base := startLikeServe(t, store, sim, engine.Options{AcquirerTimeout: 5 * time.Second, Lease: 10 * time.Second})
			do := caller(t, base)
			other := map[string]string{"Authorization": "Bearer " + apitest.OtherAPIKey}

			created := do("POST", "/v1/webhook_endpoints", `{"url":"https://hooks.example.com/a"}`, nil)
			var ep struct{ ID, Secret, Status string }
			if created.Status != 201 || json.Unmarshal(created.Body, &ep) != nil || !strings.HasPrefix(ep.Secret, "whsec_") || ep.Status != "enabled" {
				t.Fatalf("create: %d %s", created.Status, created.Body)
			}
			list := do("GET", "/v1/webhook_endpoints", "", nil)
			if list.Status != 200 || strings.Contains(string(list.Body), "whsec_") || !strings.Contains(string(list.Body), ep.ID) {
				t.Fatalf("list: %d %s (a secret must never be listed)", list.Status, list.Body)
			}
			if r := do("GET", "/v1/webhook_endpoints", "", other); strings.Contains(string(r.Body), ep.ID) {
				t.Fatalf("another merchant lists %s: %s", ep.ID, r.Body)
			}
			if r := do("POST", "/v1/webhook_endpoints/"+ep.ID+"/rotate_secret", "", other); r.Status != 404 {
				t.Fatalf("another merchant rotates: %d %s", r.Status, r.Body)
			}
			if r := do("DELETE", "/v1/webhook_endpoints/"+ep.ID, "", other); r.Status != 404 {
				t.Fatalf("another merchant deletes: %d %s", r.Status, r.Body)
			}
			rot := do("POST", "/v1/webhook_endpoints/"+ep.ID+"/rotate_secret", "", nil)
			var rotated struct{ Secret string }
			if rot.Status != 200 || json.Unmarshal(rot.Body, &rotated) != nil || rotated.Secret == ep.Secret || !strings.HasPrefix(rotated.Secret, "whsec_") {
				t.Fatalf("rotate: %d %s", rot.Status, rot.Body)
			}

			// A settled charge's event, seen by its merchant only.
			order := orderSeq.Add(1)
			ch := apitest.Charge(t, base, fmt.Sprintf("wh-%d", order), chargeBody(order, "tok_ok"))
			var charge struct{ ID string }
			_ = json.Unmarshal(ch.Body, &charge)
			evs := do("GET", "/v1/events?charge_id="+charge.ID, "", nil)
			var page struct {
				Data []struct {
					ID, Type string
					Data     struct{ Object json.RawMessage }
				}
			}
			if evs.Status != 200 || json.Unmarshal(evs.Body, &page) != nil || len(page.Data) != 1 || page.Data[0].Type != "charge.captured" {
				t.Fatalf("events of %s: %d %s", charge.ID, evs.Status, evs.Body)
			}
			get := do("GET", "/v1/charges/"+charge.ID, "", nil)
			if string(page.Data[0].Data.Object) != string(get.Body) {
				t.Fatalf("the event's charge %s is not GET /v1/charges/{id}'s %s", page.Data[0].Data.Object, get.Body)
			}
			if r := do("GET", "/v1/events/"+page.Data[0].ID, "", other); r.Status != 404 {
				t.Fatalf("another merchant reads the event: %d", r.Status)
			}
			if r := do("POST", "/v1/events/"+page.Data[0].ID+"/redeliver", "", other); r.Status != 404 {
				t.Fatalf("another merchant redelivers the event: %d", r.Status)
			}

			mistakes := map[string]string{
				`{"url":"http://hooks.example.com/a"}`:       "url",
				`{"url":"https://127.0.0.1/a"}`:              "url",
				`{"url":"https://[::1]/a"}`:                  "url",
				`{"url":"https://10.0.0.1/a"}`:               "url",
				`{"url":"https://169.254.169.254/a"}`:        "url",
				`{"url":"https://u:p@hooks.example.com/"}`:   "url",
				`{"url":"https://hooks.example.com/\u0000"}`: "url",
				`{"url":""}`:          "url",
				`{"description":"x"}`: "url",
				`{"url":"https://hooks.example.com/","url":"https://x.example.com/"}`:                                    "url",
				`{"url":"https://hooks.example.com/","secret":"mine"}`:                                                   "secret",
				`{"url":"https://hooks.example.com/","description":` + fmt.Sprintf("%q", strings.Repeat("d", 501)) + `}`: "description",
				`{"url":42}`: "url",
				`[`:          "",
			}
			for body, field := range mistakes {
				r := do("POST", "/v1/webhook_endpoints", body, nil)
				var p struct{ Type, Field string }
				_ = json.Unmarshal(r.Body, &p)
				if r.Status != 400 || !strings.HasSuffix(p.Type, "validation-failed") || p.Field != field {
					t.Errorf("POST %s: %d %s, want 400 naming %q", body, r.Status, r.Body, field)
				}
			}
			for _, q := range []string{"?limit=101", "?limit=x", "?starting_after=evt_nope", "?foo=1", "?charge_id=a&charge_id=b"} {
				if r := do("GET", "/v1/events"+q, "", nil); r.Status != 400 {
					t.Errorf("GET /v1/events%s: %d %s, want 400", q, r.Status, r.Body)
				}
			}
			for _, id := range []string{"we_%00", "we_" + strings.Repeat("a", 300), "%C3%28"} {
				if r := do("DELETE", "/v1/webhook_endpoints/"+id, "", nil); r.Status != 404 {
					t.Errorf("DELETE endpoint %q: %d %s, want 404", id, r.Status, r.Body)
				}
			}
			if r := do("DELETE", "/v1/webhook_endpoints/"+ep.ID, "", nil); r.Status != 204 {
				t.Fatalf("delete: %d %s", r.Status, r.Body)
			}
		})
	}
}

// caller returns a function that sends a request to the API at base (an
// empty body sends none) and fails the test when it cannot be sent.
func caller(t *testing.T, base string) func(method, path, body string, headers map[string]string) apitest.Result {
	return func(method, path, body string, headers map[string]string) apitest.Result {
		t.Helper()
		var b []byte
		if body != "" {
			b = []byte(body)
		}
		r, err := apitest.Do(t, nil, method, base+path, b, headers)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
}
