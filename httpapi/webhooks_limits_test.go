package httpapi_test

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/httpapi"
	"github.com/chargeonce/chargeonce/internal/apitest"
)

// TestRedeliverBounded: 200 redeliveries of one event, 8 at a time, leave
// one pending delivery per endpoint, whatever their answers; beyond the
// merchant's rate on the webhook and event routes they are refused 429
// with Retry-After, and another merchant is still served meanwhile. Seen
// before: no limit and no dedupe, 27,017 calls in 40 s left 432,288
// pending deliveries.
func TestRedeliverBounded(t *testing.T) {
	t.Parallel()
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			s := apitest.Store(t, kind)
			sim := apitest.Simulator(t, acquirer.Options{})
			base := startLikeServe(t, s, sim, engine.Options{AcquirerTimeout: 5 * time.Second, Lease: 10 * time.Second})
			do := func(method, path, body string, headers map[string]string) apitest.Result {
				t.Helper()
				var b []byte
				if body != "" {
					b = []byte(body)
				}
				r, err := apitest.Do(t, nil, method, base+path, b, headers)
				if err != nil {
					t.Error(err)
				}
				return r
			}
			for _, u := range []string{"https://a.example.com/", "https://b.example.com/"} {
				if r := do("POST", "/v1/webhook_endpoints", `{"url":"`+u+`"}`, nil); r.Status != 201 {
					t.Fatalf("create: %d %s", r.Status, r.Body)
				}
			}
			order := orderSeq.Add(1)
			ch := apitest.Charge(t, base, fmt.Sprintf("rd-%d", order), chargeBody(order, "tok_ok"))
			var charge struct{ ID string }
			_ = json.Unmarshal(ch.Body, &charge)
			evID := "evt_" + charge.ID[3:]

			// 200 redeliveries, 8 at a time. The limiter may accept its
			// burst and what its rate refills while they run, never more; an
			// unbounded route accepts all 200. A run so slow (a loaded machine
			// under -race) that the refill alone covers 200 proves nothing,
			// so it is run again, at most three times.
			rate := httpapi.DefaultWebhooksRate
			flood := func() (accepted, limited int64, bound float64) {
				var (
					acc, lim atomic.Int64
					wg       sync.WaitGroup
					work     = make(chan struct{})
				)
				go func() {
					for range 200 {
						work <- struct{}{}
					}
					close(work)
				}()
				start := time.Now()
				for range 8 {
					wg.Go(func() {
						for range work {
							r := do("POST", "/v1/events/"+evID+"/redeliver", "", nil)
							switch r.Status {
							case 202:
								acc.Add(1)
							case 429:
								lim.Add(1)
								if ra, err := strconv.Atoi(r.Header.Get("Retry-After")); err != nil || ra < 1 {
									t.Errorf("429 with Retry-After %q", r.Header.Get("Retry-After"))
								}
							default:
								t.Errorf("redeliver: %d %s", r.Status, r.Body)
							}
						}
					})
				}
				// Another merchant is served while demo is over its rate.
				other := map[string]string{"Authorization": "Bearer " + apitest.OtherAPIKey}
				if r := do("GET", "/v1/webhook_endpoints", "", other); r.Status != 200 {
					t.Errorf("another merchant during the flood: %d %s", r.Status, r.Body)
				}
				wg.Wait()
				return acc.Load(), lim.Load(), float64(rate.Burst) + rate.PerSecond*time.Since(start).Seconds() + 1
			}
			var accepted, limited int64
			for try := 1; ; try++ {
				var bound float64
				accepted, limited, bound = flood()
				if float64(accepted) > bound {
					t.Fatalf("200 redeliveries: %d accepted, more than the burst of %d and %g/s allow in the time they took (%.0f)",
						accepted, rate.Burst, rate.PerSecond, bound)
				}
				if bound < 200 {
					if limited == 0 {
						t.Fatalf("200 redeliveries: %d accepted, none refused 429", accepted)
					}
					break
				}
				if try == 3 {
					t.Fatalf("200 redeliveries took so long, three times, that the rate's refill alone allowed all of them: nothing proven")
				}
				t.Logf("try %d: too slow to tell (%d accepted, bound %.0f); again", try, accepted, bound)
			}
			st, err := s.WebhookStats(t.Context())
			if err != nil || st.Pending != 2 {
				t.Fatalf("after %d accepted redeliveries: %d pending deliveries, %v; want 2, one per endpoint", accepted, st.Pending, err)
			}
			t.Logf("200 redeliveries: %d accepted, %d refused 429; %d pending deliveries", accepted, limited, st.Pending)
		})
	}
}

// TestEndpointCapRace: 64 concurrent POST /v1/webhook_endpoints of one
// merchant make at most MaxWebhookEndpoints endpoints; each other answer is
// a 400 naming url or a 429 (the routes' rate). Seen before: 35 endpoints
// against a cap of 16.
func TestEndpointCapRace(t *testing.T) {
	t.Parallel()
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			s := apitest.Store(t, kind)
			sim := apitest.Simulator(t, acquirer.Options{})
			base := startLikeServe(t, s, sim, engine.Options{AcquirerTimeout: 5 * time.Second, Lease: 10 * time.Second})
			var (
				wg                       sync.WaitGroup
				created, capped, limited atomic.Int64
			)
			for i := range 64 {
				wg.Go(func() {
					r, err := apitest.Do(t, nil, "POST", base+"/v1/webhook_endpoints", fmt.Appendf(nil, `{"url":"https://h%d.example.com/"}`, i), nil)
					if err != nil {
						t.Error(err)
						return
					}
					var p struct{ Field string }
					_ = json.Unmarshal(r.Body, &p)
					switch {
					case r.Status == 201:
						created.Add(1)
					case r.Status == 400 && p.Field == "url":
						capped.Add(1)
					case r.Status == 429:
						limited.Add(1)
					default:
						t.Errorf("create: %d %s", r.Status, r.Body)
					}
				})
			}
			wg.Wait()
			eps, err := s.WebhookEndpointsList(t.Context(), "demo")
			if err != nil || created.Load() != httpapi.MaxWebhookEndpoints || len(eps) != httpapi.MaxWebhookEndpoints || capped.Load() == 0 {
				t.Fatalf("64 concurrent creates: %d created, %d refused at the cap, %d over the rate, %d listed (%v); want %d",
					created.Load(), capped.Load(), limited.Load(), len(eps), err, httpapi.MaxWebhookEndpoints)
			}
		})
	}
}

// TestEndpointURLSecretNotLogged: creating an endpoint whose URL holds a
// token logs the URL with the token redacted (seen before: the whole URL
// at INFO), while the API still answers the merchant its own URL.
func TestEndpointURLSecretNotLogged(t *testing.T) {
	t.Parallel()
	var logs apitest.Buffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	keys, err := httpapi.ParseKeys("demo:" + apitest.APIKey)
	if err != nil {
		t.Fatal(err)
	}
	store := apitest.Store(t, "sqlite")
	eng := engine.New(store, apitest.Simulator(t, acquirer.Options{}), engine.Options{AcquirerTimeout: 5 * time.Second, Lease: 10 * time.Second})
	srv := httptest.NewServer(httpapi.LogRequests(log, httpapi.New(httpapi.Config{Engine: eng, Store: store, Keys: keys, Logger: log})))
	defer srv.Close()
	r, err := apitest.Do(t, nil, "POST", srv.URL+"/v1/webhook_endpoints", []byte(`{"url":"https://hooks.example.com/in?token=tok-s3cr3t"}`), nil)
	if err != nil || r.Status != 201 || !strings.Contains(string(r.Body), "tok-s3cr3t") {
		t.Fatalf("create: %d %s, %v", r.Status, r.Body, err)
	}
	if !strings.Contains(logs.String(), "webhook endpoint created") || strings.Contains(logs.String(), "tok-s3cr3t") {
		t.Fatalf("log (want the creation, without the token):\n%s", logs.String())
	}
}

// TestEndpointLifecycleAPI: enabled_events on creation, a test event that
// reaches the receiver signed, {"disabled": true} then {"disabled": false},
// and "recover failed since T", on both stores.
func TestEndpointLifecycleAPI(t *testing.T) {
	t.Parallel()
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			var got atomic.Int64
			recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Header.Get("webhook-signature") != "" && r.Header.Get("webhook-id") != "" {
					got.Add(1)
				}
			}))
			defer recv.Close()
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
			if r := do("POST", "/v1/webhook_endpoints", `{"url":"`+recv.URL+`","enabled_events":["charge.nope"]}`); r.Status != 400 {
				t.Fatalf("unknown event type: %d %s", r.Status, r.Body)
			}
			// Every type the service records may be enabled: the refunds',
			// the manual captures' and the reconciliation's too (each once
			// refused as unknown, so an endpoint could get them only by "*").
			for _, typ := range chargeonce.EventTypes {
				r := do("POST", "/v1/webhook_endpoints", `{"url":"`+recv.URL+`","enabled_events":["`+typ+`"]}`)
				var made struct{ ID string }
				if r.Status != 201 || json.Unmarshal(r.Body, &made) != nil {
					t.Fatalf("an endpoint for %s: %d %s", typ, r.Status, r.Body)
				}
				if r := do("DELETE", "/v1/webhook_endpoints/"+made.ID, ""); r.Status != 200 && r.Status != 204 {
					t.Fatalf("deleting the endpoint for %s: %d %s", typ, r.Status, r.Body)
				}
			}
			for _, typ := range []string{"refund.created", "refund.updated", "refund.failed", "charge.refunded", "charge.canceled", "reconciliation.completed"} {
				if !slices.Contains(chargeonce.EventTypes, typ) {
					t.Errorf("%s is recorded but cannot be enabled on an endpoint", typ)
				}
			}
			r := do("POST", "/v1/webhook_endpoints", `{"url":"`+recv.URL+`","enabled_events":["charge.declined"]}`)
			var ep struct {
				ID            string
				EnabledEvents []string `json:"enabled_events"`
				Status        string
			}
			if r.Status != 201 || json.Unmarshal(r.Body, &ep) != nil || len(ep.EnabledEvents) != 1 || ep.EnabledEvents[0] != "charge.declined" {
				t.Fatalf("create: %d %s", r.Status, r.Body)
			}
			r = do("POST", "/v1/webhook_endpoints/"+ep.ID+"/test", "")
			var test struct {
				Delivered  bool
				StatusCode *int `json:"status_code"`
			}
			if r.Status != 200 || json.Unmarshal(r.Body, &test) != nil || !test.Delivered || got.Load() != 1 {
				t.Fatalf("test event: %d %s (receiver got %d)", r.Status, r.Body, got.Load())
			}
			if r := do("POST", "/v1/webhook_endpoints/"+ep.ID, `{"disabled":true}`); r.Status != 200 || !strings.Contains(string(r.Body), `"disabled"`) {
				t.Fatalf("disable: %d %s", r.Status, r.Body)
			}
			if r := do("POST", "/v1/webhook_endpoints/"+ep.ID+"/recover", `{"since":"2026-01-01T00:00:00Z"}`); r.Status != 400 {
				t.Fatalf("recover to a disabled endpoint: %d %s", r.Status, r.Body)
			}
			r = do("POST", "/v1/webhook_endpoints/"+ep.ID, `{"disabled":false,"enabled_events":["*"]}`)
			if r.Status != 200 || json.Unmarshal(r.Body, &ep) != nil || ep.Status != "enabled" || ep.EnabledEvents[0] != "*" {
				t.Fatalf("enable again: %d %s", r.Status, r.Body)
			}
			if r := do("POST", "/v1/webhook_endpoints/"+ep.ID+"/recover", `{"since":"2026-01-01T00:00:00Z"}`); r.Status != 202 || !strings.Contains(string(r.Body), `"deliveries_queued":0`) {
				t.Fatalf("recover: %d %s", r.Status, r.Body)
			}
			for body, field := range map[string]string{`{}`: "disabled", `{"since":"yesterday"}`: "since", `{"disabled":"no"}`: "disabled"} {
				path := "/v1/webhook_endpoints/" + ep.ID
				if field == "since" {
					path += "/recover"
				}
				if r := do("POST", path, body); r.Status != 400 {
					t.Errorf("POST %s %s: %d %s, want 400", path, body, r.Status, r.Body)
				}
			}
			for _, p := range []string{"/v1/webhook_endpoints/we_nope", "/v1/webhook_endpoints/we_nope/test", "/v1/webhook_endpoints/we_nope/recover"} {
				if r := do("POST", p, `{"disabled":false,"since":"2026-01-01T00:00:00Z"}`); r.Status != 404 && r.Status != 400 {
					t.Errorf("POST %s: %d %s, want 404", p, r.Status, r.Body)
				}
			}
		})
	}
}
