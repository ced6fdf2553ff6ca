package httpapi_test

import (
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/httpapi"
	"github.com/chargeonce/chargeonce/internal/apitest"
)

// TestEndpointMaxConcurrencyAPI: max_concurrency is shown on every
// endpoint (16 by default), set at creation and by the update route, and
// out of 1–64 (or not an integer) refused 400 naming it, with nothing
// written.
func TestEndpointMaxConcurrencyAPI(t *testing.T) {
	t.Parallel()
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			store := apitest.Store(t, kind)
			keys, err := httpapi.ParseKeys("demo:" + apitest.APIKey)
			if err != nil {
				t.Fatal(err)
			}
			eng := engine.New(store, apitest.Simulator(t, acquirer.Options{}), engine.Options{AcquirerTimeout: 5 * time.Second, Lease: 10 * time.Second})
			srv := httptest.NewServer(httpapi.New(httpapi.Config{Engine: eng, Store: store, Keys: keys, WebhooksAllowPrivate: true}))
			defer srv.Close()
			do := func(method, path, body string) apitest.Result {
				t.Helper()
				var b []byte
				if body != "" {
					b = []byte(body)
				}
				r, err := apitest.Do(t, nil, method, srv.URL+path, b, nil)
				if err != nil {
					t.Fatal(err)
				}
				return r
			}
			type endpoint struct {
				ID             string
				MaxConcurrency *int `json:"max_concurrency"`
			}
			decode := func(what string, r apitest.Result, status int) endpoint {
				t.Helper()
				var ep endpoint
				if r.Status != status || json.Unmarshal(r.Body, &ep) != nil || ep.MaxConcurrency == nil {
					t.Fatalf("%s: %d %s", what, r.Status, r.Body)
				}
				return ep
			}
			url := "http://127.0.0.1:9/hook"
			def := decode("create", do("POST", "/v1/webhook_endpoints", `{"url":"`+url+`"}`), 201)
			if *def.MaxConcurrency != 16 {
				t.Fatalf("default max_concurrency %d, want 16", *def.MaxConcurrency)
			}
			four := decode("create with 4", do("POST", "/v1/webhook_endpoints", `{"url":"`+url+`","max_concurrency":4}`), 201)
			if *four.MaxConcurrency != 4 {
				t.Fatalf("max_concurrency %d, want 4", *four.MaxConcurrency)
			}
			for _, bad := range []string{`0`, `-1`, `65`, `1.5`, `"8"`, `1e9`, `99999999999999999999`} {
				for _, path := range []string{"/v1/webhook_endpoints", "/v1/webhook_endpoints/" + def.ID} {
					r := do("POST", path, `{"url":"`+url+`","max_concurrency":`+bad+`}`)
					if strings.HasSuffix(path, def.ID) {
						r = do("POST", path, `{"max_concurrency":`+bad+`}`)
					}
					if r.Status != 400 || !strings.Contains(string(r.Body), "max_concurrency") {
						t.Errorf("POST %s max_concurrency %s: %d %s, want 400 naming max_concurrency", path, bad, r.Status, r.Body)
					}
				}
			}
			up := decode("update", do("POST", "/v1/webhook_endpoints/"+def.ID, `{"max_concurrency":64}`), 200)
			if *up.MaxConcurrency != 64 {
				t.Fatalf("updated max_concurrency %d, want 64", *up.MaxConcurrency)
			}
			r := do("GET", "/v1/webhook_endpoints", "")
			var list struct{ Data []endpoint }
			if r.Status != 200 || json.Unmarshal(r.Body, &list) != nil || len(list.Data) != 2 {
				t.Fatalf("list: %d %s (nothing written by the refused requests)", r.Status, r.Body)
			}
			want := map[string]int{def.ID: 64, four.ID: 4}
			for _, e := range list.Data {
				if e.MaxConcurrency == nil || *e.MaxConcurrency != want[e.ID] {
					t.Fatalf("listed %s: %s", e.ID, r.Body)
				}
			}
		})
	}
}
