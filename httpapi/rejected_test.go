package httpapi_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/httpapi"
	"github.com/chargeonce/chargeonce/internal/apitest"
	"github.com/chargeonce/chargeonce/metrics"
	"github.com/chargeonce/chargeonce/wire"
)

// TestRejectedRequestsAreCounted (SPEC "Operations"): 400s, 401s, 413s and
// 405s show on /metrics by route (the mux pattern, never the raw path),
// status and problem slug, so an operator sees rejected traffic without its
// unbounded parts.
func TestRejectedRequestsAreCounted(t *testing.T) {
	t.Parallel()
	store := apitest.SQLiteStore(t)
	m := metrics.New()
	keys, err := httpapi.ParseKeys(httpapi.DemoAPIKeys)
	if err != nil {
		t.Fatal(err)
	}
	eng := engine.New(store, apitest.Simulator(t, acquirer.Options{}), engine.Options{})
	srv := httptest.NewServer(httpapi.New(httpapi.Config{Engine: eng, Store: store, Keys: keys, Metrics: m.Handler(), Rejections: m}))
	t.Cleanup(srv.Close)
	send := func(method, path, apiKey, idemKey, body string) {
		t.Helper()
		var b []byte
		if body != "" {
			b = []byte(body)
		}
		if _, err := apitest.Do(t, nil, method, srv.URL+path, b, map[string]string{"Authorization": apiKey, "Idempotency-Key": idemKey}); err != nil {
			t.Fatal(err)
		}
	}
	good := "Bearer " + apitest.APIKey
	for i := range 3 {
		send("POST", "/v1/charges", "Bearer nope"+strings.Repeat("x", i), "k", chargeBody(1, "tok_ok"))
	}
	send("POST", "/v1/charges", good, "", chargeBody(1, "tok_ok"))
	send("POST", "/v1/charges", good, "k1", `{"order_id":1,"nope":1}`)
	send("POST", "/v1/charges", good, "k2", strings.Repeat(" ", wire.MaxBodyBytes+1))
	send("GET", "/v1/charges?order_id=-1", good, "", "")
	send("DELETE", "/v1/charges/ch_secret_path_part", good, "", "")

	resp, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`chargeonce_http_rejected_requests_total{problem="unauthorized",route="POST /v1/charges",status="401"} 3`,
		`chargeonce_http_rejected_requests_total{problem="missing-idempotency-key",route="POST /v1/charges",status="400"} 1`,
		`chargeonce_http_rejected_requests_total{problem="validation-failed",route="POST /v1/charges",status="400"} 1`,
		`chargeonce_http_rejected_requests_total{problem="payload-too-large",route="POST /v1/charges",status="413"} 1`,
		`chargeonce_http_rejected_requests_total{problem="validation-failed",route="GET /v1/charges",status="400"} 1`,
		`chargeonce_http_rejected_requests_total{problem="method-not-allowed",route="/v1/charges/{id}",status="405"} 1`,
	} {
		if !strings.Contains(string(b), want+"\n") {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if strings.Contains(string(b), "ch_secret_path_part") || strings.Contains(string(b), "nope") {
		t.Error("/metrics holds a raw path or a key")
	}
	if t.Failed() {
		for line := range strings.SplitSeq(string(b), "\n") {
			if strings.HasPrefix(line, "chargeonce_http_rejected") {
				t.Log(line)
			}
		}
	}
}
