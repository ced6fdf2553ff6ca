package httpapi_test

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/httpapi"
	"github.com/chargeonce/chargeonce/internal/apitest"
)

// requestLine is one JSON line of LogRequests.
type requestLine struct {
	Msg       string  `json:"msg"`
	Method    string  `json:"method"`
	Route     string  `json:"route"`
	Status    int     `json:"status"`
	Outcome   string  `json:"outcome"`
	Merchant  string  `json:"merchant"`
	KeyHash   string  `json:"key_hash"`
	LatencyMS float64 `json:"latency_ms"`
}

// TestLogsHoldNoSecretAndNoIdempotencyKey runs real requests — successes,
// replays, conflicts, declines, unknown outcomes, bad API keys, bad
// idempotency keys, a dead database — whose API keys and idempotency keys
// all carry one random canary, through a server logging in both formats at
// debug level, and then looks for the canary in everything logged. It also
// checks that every request got exactly one line with the right route,
// outcome, merchant and key hash.
func TestLogsHoldNoSecretAndNoIdempotencyKey(t *testing.T) {
	t.Parallel()
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			var rnd [6]byte
			_, _ = rand.Read(rnd[:])
			canary := "canary" + hex.EncodeToString(rnd[:])
			secret := "sk_live_" + canary
			other := "sk_live_other_" + canary

			var jsonBuf, textBuf apitest.Buffer
			opts := &slog.HandlerOptions{Level: slog.LevelDebug}
			log := slog.New(slog.NewMultiHandler(slog.NewJSONHandler(&jsonBuf, opts), slog.NewTextHandler(&textBuf, opts)))
			keys, err := httpapi.ParseKeys("acme:" + secret + ",globex:" + other)
			if err != nil {
				t.Fatal(err)
			}
			start := func(storeKind string) (string, func()) {
				store := apitest.Store(t, storeKind)
				sim := apitest.Simulator(t, acquirer.Options{Slow: 400 * time.Millisecond})
				eng := engine.New(store, sim, engine.Options{AcquirerTimeout: 5 * time.Second, Lease: 10 * time.Second, Logger: log})
				api := httpapi.New(httpapi.Config{Engine: eng, Store: store, Keys: keys, Logger: log})
				srv := httptest.NewServer(httpapi.LogRequests(log, api))
				t.Cleanup(srv.Close)
				return srv.URL, func() { store.Close() }
			}
			base, _ := start(kind)
			deadBase, closeDead := start(kind)
			closeDead()

			sent := 0
			do := func(baseURL, method, path, apiKey, idemKey, body string) apitest.Result {
				t.Helper()
				sent++
				h := map[string]string{"Authorization": "Bearer " + apiKey, "Idempotency-Key": idemKey}
				var b []byte
				if body != "" {
					b = []byte(body)
				}
				r, err := apitest.Do(t, nil, method, baseURL+path, b, h)
				if err != nil {
					t.Fatalf("%s %s: %v", method, path, err)
				}
				return r
			}
			idem := func(n int) string { return fmt.Sprintf("order-%s-%d", canary, n) }
			order := orderSeq.Add(1)
			body := chargeBody(order, "tok_ok")

			// A slow charge and a retry that finds it in flight (409).
			slowOrder := orderSeq.Add(1)
			slowDone := make(chan struct{})
			sent++ // the goroutine's request
			go func() {
				defer close(slowDone)
				_, _ = apitest.Do(t, nil, "POST", base+"/v1/charges", []byte(chargeBody(slowOrder, "tok_slow")),
					map[string]string{"Authorization": "Bearer " + secret, "Idempotency-Key": idem(9)})
			}()
			polls := 0
			apitest.Eventually(t, 5*time.Second, "the slow charge's record", func() bool {
				polls++
				r, err := apitest.Do(t, nil, "GET", fmt.Sprintf("%s/v1/charges?order_id=%d", base, slowOrder), nil,
					map[string]string{"Authorization": "Bearer " + secret})
				return err == nil && bytes.Contains(r.Body, []byte(`"processing"`))
			})
			sent += polls
			var expect []requestLine
			check := func(r apitest.Result, status int, route, outcome, merchant, key string) {
				t.Helper()
				if r.Status != status {
					t.Fatalf("%s: status %d, want %d: %s", route, r.Status, status, r.Body)
				}
				e := requestLine{Msg: "request", Route: route, Status: status, Outcome: outcome, Merchant: merchant}
				if key != "" {
					e.KeyHash = httpapi.KeyHash(merchant, key)
				}
				expect = append(expect, e)
			}
			post := "POST /v1/charges"
			check(do(base, "POST", "/v1/charges", secret, idem(9), chargeBody(slowOrder, "tok_slow")), 409, post, "in-progress", "acme", idem(9))
			created := do(base, "POST", "/v1/charges", secret, idem(1), body)
			check(created, 201, post, "created", "acme", idem(1))
			check(do(base, "POST", "/v1/charges", secret, `"`+idem(1)+`"`, body), 201, post, "replayed", "acme", idem(1))
			check(do(base, "POST", "/v1/charges", other, idem(1), body), 201, post, "created", "globex", idem(1))
			check(do(base, "POST", "/v1/charges", secret, idem(1), chargeBody(order, "tok_declined")), 422, post, "key-reused", "acme", idem(1))
			check(do(base, "POST", "/v1/charges", secret, idem(2), chargeBody(orderSeq.Add(1), "tok_declined")), 402, post, "declined", "acme", idem(2))
			check(do(base, "POST", "/v1/charges", secret, idem(3), chargeBody(orderSeq.Add(1), "tok_fail_before")), 202, post, "unknown", "acme", idem(3))
			check(do(base, "POST", "/v1/charges", "sk_live_wrong_"+canary, idem(4), body), 401, post, "client-error", "", "")
			check(do(base, "POST", "/v1/charges", secret, "bad key "+canary, body), 400, post, "client-error", "acme", "")
			check(do(base, "POST", "/v1/charges", secret, strings.Repeat(canary, 30), body), 400, post, "client-error", "acme", "")
			check(do(base, "POST", "/v1/charges", secret, idem(5), `{"order_id": 1, "`+canary+`": 2}`), 400, post, "client-error", "acme", idem(5))
			var ch struct{ ID string }
			_ = json.Unmarshal(created.Body, &ch)
			check(do(base, "GET", "/v1/charges/"+ch.ID, secret, "", ""), 200, "GET /v1/charges/{id}", "ok", "acme", "")
			check(do(base, "GET", "/v1/charges/ch_"+canary, secret, "", ""), 404, "GET /v1/charges/{id}", "client-error", "acme", "")
			check(do(base, "GET", "/"+canary+"?q="+canary, secret, "", ""), 404, "/", "client-error", "", "")
			check(do(base, "DELETE", "/v1/charges/"+ch.ID, secret, "", ""), 405, "/v1/charges/{id}", "client-error", "", "")
			check(do(base, "GET", "/healthz", "", "", ""), 200, "GET /healthz", "ok", "", "")
			dead := do(deadBase, "POST", "/v1/charges", secret, idem(6), body)
			if dead.Status < 500 {
				t.Fatalf("POST on a closed database: %d %s", dead.Status, dead.Body)
			}
			check(dead, dead.Status, post, map[bool]string{true: "unavailable", false: "internal-error"}[dead.Status == 503], "acme", idem(6))
			check(do(deadBase, "GET", "/v1/charges/"+ch.ID, secret, "", ""), dead.Status, "GET /v1/charges/{id}", map[bool]string{true: "unavailable", false: "internal-error"}[dead.Status == 503], "acme", "")
			<-slowDone
			// A line is written just after its answer is sent: wait for the
			// last ones.
			apitest.Eventually(t, 5*time.Second, "a request line for every request", func() bool {
				return strings.Count(jsonBuf.String(), `"msg":"request"`) >= sent && strings.Count(textBuf.String(), " msg=request ") >= sent
			})

			for name, logged := range map[string]string{"json": jsonBuf.String(), "text": textBuf.String()} {
				if i := strings.Index(logged, canary); i >= 0 {
					t.Errorf("the %s log holds an API key or an idempotency key (canary %s) near byte %d:\n%s", name, canary, i, logged)
				}
				if strings.Contains(logged, "Bearer") {
					t.Errorf("the %s log holds an Authorization header:\n%s", name, logged)
				}
			}
			if n := strings.Count(textBuf.String(), " msg=request "); n != sent {
				t.Errorf("the text log has %d request lines for %d requests", n, sent)
			}
			lines := requestLines(t, jsonBuf.String())
			if len(lines) != sent {
				t.Fatalf("the json log has %d request lines for %d requests:\n%s", len(lines), sent, jsonBuf.String())
			}
			// Every request has its own line; lines are matched to requests
			// as a multiset (a line is written after its answer is sent, so
			// their order may differ from the requests').
			slow := requestLine{Msg: "request", Route: post, Status: 201, Outcome: "created", Merchant: "acme", KeyHash: httpapi.KeyHash("acme", idem(9))}
			poll := requestLine{Msg: "request", Route: "GET /v1/charges", Status: 200, Outcome: "ok", Merchant: "acme"}
			for range polls {
				expect = append(expect, poll)
			}
			expect = append(expect, slow)
			used := make([]bool, len(lines))
			for _, e := range expect {
				found := false
				for i, l := range lines {
					if used[i] || l.LatencyMS <= 0 {
						continue
					}
					l.LatencyMS, l.Method = 0, ""
					if l == e {
						used[i], found = true, true
						break
					}
				}
				if !found {
					t.Errorf("no request line %+v in the log:\n%s", e, jsonBuf.String())
				}
			}
			if httpapi.KeyHash("acme", idem(1)) == httpapi.KeyHash("globex", idem(1)) {
				t.Error("one key of two merchants hashes alike")
			}
		})
	}
}

// requestLines returns the msg=request lines of a JSON log.
func requestLines(t *testing.T, logged string) []requestLine {
	t.Helper()
	var out []requestLine
	for _, s := range strings.Split(strings.TrimSpace(logged), "\n") {
		if s == "" {
			continue
		}
		var l requestLine
		if err := json.Unmarshal([]byte(s), &l); err != nil {
			t.Fatalf("a log line is not JSON: %q: %v", s, err)
		}
		if l.Msg == "request" {
			out = append(out, l)
		}
	}
	return out
}
