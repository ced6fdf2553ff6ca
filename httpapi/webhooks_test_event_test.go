package httpapi_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/httpapi"
	"github.com/chargeonce/chargeonce/internal/apitest"
	"github.com/chargeonce/chargeonce/webhook"
)

// TestEndpointTestsBounded (issue 48, item 4): 40 concurrent test events
// of one merchant to a receiver that never answers hold at most
// webhook.MaxTestsInFlight outbound connections (and the API requests
// waiting on them); the others are refused 429 with Retry-After at once,
// and another merchant's test event is sent meanwhile. Seen before: ~21
// calls a second held 322 outbound and 334 API connections, one each.
func TestEndpointTestsBounded(t *testing.T) {
	t.Parallel()
	s := apitest.Store(t, "sqlite")
	hole := apitest.NewBlackHole(t)
	var got atomic.Int64
	healthy := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { got.Add(1) }))
	t.Cleanup(healthy.Close)
	keys, err := httpapi.ParseKeys("demo:" + apitest.APIKey + ",other:" + apitest.OtherAPIKey)
	if err != nil {
		t.Fatal(err)
	}
	eng := engine.New(s, apitest.Simulator(t, acquirer.Options{}), engine.Options{AcquirerTimeout: 5 * time.Second, Lease: 10 * time.Second})
	srv := httptest.NewServer(httpapi.New(httpapi.Config{Engine: eng, Store: s, Keys: keys, WebhooksAllowPrivate: true}))
	t.Cleanup(srv.Close)
	other := map[string]string{"Authorization": "Bearer " + apitest.OtherAPIKey}
	create := func(url string, h map[string]string) string {
		r, err := apitest.Do(t, nil, "POST", srv.URL+"/v1/webhook_endpoints", []byte(`{"url":"`+url+`"}`), h)
		var ep struct{ ID string }
		if err != nil || r.Status != 201 || json.Unmarshal(r.Body, &ep) != nil {
			t.Fatalf("create: %v %d %s", err, r.Status, r.Body)
		}
		return ep.ID
	}
	dead, live := create(hole.URL+"/hook", nil), create(healthy.URL, other)

	const calls = 40
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		statuses = map[int]int{}
		refused  = make(chan struct{}, calls)
	)
	for range calls {
		wg.Go(func() {
			r, err := apitest.Do(t, nil, "POST", srv.URL+"/v1/webhook_endpoints/"+dead+"/test", nil, nil)
			if err != nil {
				return // cut when the black hole closes
			}
			mu.Lock()
			statuses[r.Status]++
			mu.Unlock()
			if r.Status == 429 {
				if r.Header.Get("Retry-After") == "" {
					t.Errorf("429 without Retry-After: %s", r.Body)
				}
				refused <- struct{}{}
			}
		})
	}
	// The calls over the bound are answered at once; the rest wait at the
	// black hole.
	apitest.Eventually(t, 20*time.Second, "the test events over the bound refused", func() bool {
		return len(refused) >= calls-webhook.MaxTestsInFlight
	})
	time.Sleep(100 * time.Millisecond)
	held := hole.Held()
	r, err := apitest.Do(t, nil, "POST", srv.URL+"/v1/webhook_endpoints/"+live+"/test", nil, other)
	if err != nil || r.Status != 200 || got.Load() != 1 {
		t.Fatalf("another merchant's test event meanwhile: %v %d %s (received %d)", err, r.Status, r.Body, got.Load())
	}
	t.Logf("%d concurrent test events to a receiver that never answers: %d outbound connections held, %d refused 429 at once",
		calls, held, len(refused))
	if held > webhook.MaxTestsInFlight {
		t.Fatalf("%d test events held %d outbound connections; want at most %d", calls, held, webhook.MaxTestsInFlight)
	}
	hole.Close()
	wg.Wait()
}
