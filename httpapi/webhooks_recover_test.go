package httpapi_test

import (
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/internal/apitest"
)

// TestRecoverBounded (issue 48, item 1): "recover failed since T" owes
// again at most 100 deliveries a call, with a cursor (next_since) to go on
// from, refuses a second call on the endpoint within its cooldown (429
// with Retry-After), and owes an endpoint only the event types it asked
// for. Seen before: one call owed every failed event (3,000 a call, 130,463
// deliveries in 40 s of disable, enable, recover), charge.captured and
// refund.* to an endpoint of charge.declined.
func TestRecoverBounded(t *testing.T) {
	t.Parallel()
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			s := apitest.Store(t, kind)
			sim := apitest.Simulator(t, acquirer.Options{})
			base := startLikeServe(t, s, sim, engine.Options{AcquirerTimeout: 5 * time.Second, Lease: 10 * time.Second})
			do := func(method, path, body string) apitest.Result {
				t.Helper()
				r, err := apitest.Do(t, nil, method, base+path, []byte(body), nil)
				if err != nil {
					t.Fatal(err)
				}
				return r
			}
			endpoint := func(events string) string {
				r := do("POST", "/v1/webhook_endpoints", `{"url":"https://a.example.com/","enabled_events":`+events+`}`)
				var ep struct{ ID string }
				if r.Status != 201 || json.Unmarshal(r.Body, &ep) != nil {
					t.Fatalf("create: %d %s", r.Status, r.Body)
				}
				return ep.ID
			}
			// Both endpoints take every type while deliveries fail; one asks
			// for charge.declined alone before it is recovered.
			declinedOnly, every := endpoint(`["*"]`), endpoint(`["*"]`)
			const captured, declined = 130, 12
			var wg sync.WaitGroup
			work := make(chan string, captured+declined)
			for i := range captured + declined {
				work <- map[bool]string{true: "tok_declined", false: "tok_ok"}[i < declined]
			}
			close(work)
			for range 8 {
				wg.Go(func() {
					for token := range work {
						order := orderSeq.Add(1)
						if r := apitest.Charge(t, base, fmt.Sprintf("rcv-%d", order), chargeBody(order, token)); r.Status != 201 && r.Status != 402 {
							t.Errorf("charge %s: %d %s", token, r.Status, r.Body)
						}
					}
				})
			}
			wg.Wait()
			// Disabling ends every pending delivery: failed, owed again by
			// recover.
			for _, id := range []string{declinedOnly, every} {
				enable := `{"disabled":false}`
				if id == declinedOnly {
					enable = `{"disabled":false,"enabled_events":["charge.declined"]}`
				}
				for _, body := range []string{`{"disabled":true}`, enable} {
					if r := do("POST", "/v1/webhook_endpoints/"+id, body); r.Status != 200 {
						t.Fatalf("%s %s: %d %s", id, body, r.Status, r.Body)
					}
				}
			}
			pending := func() int {
				st, err := s.WebhookStats(t.Context())
				if err != nil {
					t.Fatal(err)
				}
				return st.Pending
			}
			if p := pending(); p != 0 {
				t.Fatalf("%d pending after disabling, want 0", p)
			}
			type recovered struct {
				Queued    int    `json:"deliveries_queued"`
				HasMore   bool   `json:"has_more"`
				NextSince string `json:"next_since"`
			}
			recoverEndpoint := func(id, since string) (recovered, apitest.Result) {
				r := do("POST", "/v1/webhook_endpoints/"+id+"/recover", `{"since":"`+since+`"}`)
				var out recovered
				if r.Status == 202 && json.Unmarshal(r.Body, &out) != nil {
					t.Fatalf("recover: %s", r.Body)
				}
				return out, r
			}
			const from = "2000-01-01T00:00:00Z"
			out, r := recoverEndpoint(declinedOnly, from)
			if r.Status != 202 || out.Queued != declined || out.HasMore {
				t.Fatalf("recover to an endpoint of charge.declined: %d %s; want the %d declined events only", r.Status, r.Body, declined)
			}
			out, r = recoverEndpoint(every, from)
			if r.Status != 202 || out.Queued != 100 || !out.HasMore || out.NextSince == "" {
				t.Fatalf("recover of %d failed events: %d %s; want 100 queued, has_more and next_since", captured+declined, r.Status, r.Body)
			}
			if p := pending(); p != declined+100 {
				t.Fatalf("%d pending after two recoveries, want %d", p, declined+100)
			}
			_, r = recoverEndpoint(every, out.NextSince)
			if ra, err := strconv.Atoi(r.Header.Get("Retry-After")); r.Status != 429 || err != nil || ra < 1 || ra > 5 {
				t.Fatalf("recover again at once: %d %s (Retry-After %q); want 429 within the endpoint's cooldown", r.Status, r.Body, r.Header.Get("Retry-After"))
			}
			time.Sleep(5100 * time.Millisecond) // the cooldown
			out, r = recoverEndpoint(every, out.NextSince)
			if r.Status != 202 || out.Queued != captured+declined-100 || out.HasMore {
				t.Fatalf("recover from next_since: %d %s; want the other %d", r.Status, r.Body, captured+declined-100)
			}
			if p := pending(); p != 2*declined+captured {
				t.Fatalf("%d pending after paging, want %d: each failed event owed once", p, 2*declined+captured)
			}
			t.Logf("%s: recover queued at most 100 a call; %d failed events owed once each in two calls 5 s apart", kind, captured+declined)
		})
	}
}
