package httpapi_test

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"log/slog"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/httpapi"
	"github.com/chargeonce/chargeonce/internal/apitest"
	"github.com/chargeonce/chargeonce/wire"
)

var requestIDRE = regexp.MustCompile(`^req_[A-Z2-7]{26}$`)

// TestEveryAnswerHasARequestID (SPEC "Every answer"): every answer — a
// charge, a replay, a decline, a client mistake, a probe, an unknown path —
// carries its own Request-Id; a problem written for the request carries the
// same id as request_id; the request's log line carries it; and a stored
// answer (a 201 or a 402 problem) is replayed byte for byte, without any
// request's id in it: the header is the answer's, the body the intent's.
func TestEveryAnswerHasARequestID(t *testing.T) {
	t.Parallel()
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			var logBuf apitest.Buffer
			log := slog.New(slog.NewJSONHandler(&logBuf, nil))
			store := apitest.Store(t, kind)
			sim := apitest.Simulator(t, acquirer.Options{})
			keys, err := httpapi.ParseKeys(httpapi.DemoAPIKeys)
			if err != nil {
				t.Fatal(err)
			}
			eng := engine.New(store, sim, engine.Options{AcquirerTimeout: 5 * time.Second, Lease: 10 * time.Second})
			srv := httptest.NewServer(httpapi.LogRequests(log, httpapi.New(httpapi.Config{Engine: eng, Store: store, Keys: keys, Logger: log})))
			t.Cleanup(srv.Close)

			seen := map[string]bool{}
			do := func(method, path, idemKey, body string, wantStatus int) apitest.Result {
				t.Helper()
				var b []byte
				if body != "" {
					b = []byte(body)
				}
				r, err := apitest.Do(t, nil, method, srv.URL+path, b, map[string]string{"Idempotency-Key": idemKey})
				if err != nil {
					t.Fatalf("%s %s: %v", method, path, err)
				}
				if r.Status != wantStatus {
					t.Fatalf("%s %s: %d %s; want %d", method, path, r.Status, r.Body, wantStatus)
				}
				id := r.Header.Get("Request-Id")
				if !requestIDRE.MatchString(id) {
					t.Fatalf("%s %s (%d): Request-Id %q; want req_ and 26 base32 characters", method, path, r.Status, id)
				}
				if seen[id] {
					t.Fatalf("%s %s: Request-Id %s was already given to another answer", method, path, id)
				}
				seen[id] = true
				// A 402 is a stored answer, the same bytes for every attempt:
				// only its header names the request.
				if r.Status >= 400 && r.Status != 402 {
					var p struct {
						RequestID string `json:"request_id"`
					}
					if err := json.Unmarshal(r.Body, &p); err != nil || p.RequestID != id {
						t.Errorf("%s %s (%d): problem %s; want request_id %s", method, path, r.Status, r.Body, id)
					}
				}
				return r
			}

			order := orderSeq.Add(1)
			first := do("POST", "/v1/charges", "rid-1", chargeBody(order, "tok_ok"), 201)
			again := do("POST", "/v1/charges", "rid-1", chargeBody(order, "tok_ok"), 201)
			declOrder := orderSeq.Add(1)
			declined := do("POST", "/v1/charges", "rid-2", chargeBody(declOrder, "tok_declined"), 402)
			declinedAgain := do("POST", "/v1/charges", "rid-2", chargeBody(declOrder, "tok_declined"), 402)
			for _, pair := range [][2]apitest.Result{{first, again}, {declined, declinedAgain}} {
				if !bytes.Equal(pair[0].Body, pair[1].Body) || pair[1].Header.Get("Idempotent-Replayed") != "true" {
					t.Errorf("replay %s differs from the first answer %s", pair[1].Body, pair[0].Body)
				}
				if bytes.Contains(pair[0].Body, []byte("req_")) {
					t.Errorf("a stored answer holds a request id: %s", pair[0].Body)
				}
			}
			do("POST", "/v1/charges", "", chargeBody(orderSeq.Add(1), "tok_ok"), 400)
			do("POST", "/v1/charges", "rid-3", `{"order_id":1,"nope":2}`, 400)
			do("POST", "/v1/charges", "rid-4", strings.Repeat(" ", wire.MaxBodyBytes+1), 413)
			do("GET", "/v1/charges/ch_nope", "", "", 404)
			do("DELETE", "/v1/charges", "", "", 405)
			do("GET", "/nowhere", "", "", 404)
			do("GET", "/healthz", "", "", 200)
			r, err := apitest.Do(t, nil, "GET", srv.URL+"/v1/charges/ch_nope", nil, map[string]string{"Authorization": "Bearer wrong", "Request-Id": "req_mine"})
			if err != nil || r.Status != 401 || r.Header.Get("Request-Id") == "req_mine" || !requestIDRE.MatchString(r.Header.Get("Request-Id")) {
				t.Errorf("a 401 to a client that sent its own Request-Id: %d, Request-Id %q; want 401 with an id of the server's", r.Status, r.Header.Get("Request-Id"))
			}
			seen[r.Header.Get("Request-Id")] = true

			logged := map[string]int{}
			for line := range strings.SplitSeq(strings.TrimSpace(logBuf.String()), "\n") {
				var l struct {
					Msg       string `json:"msg"`
					RequestID string `json:"request_id"`
				}
				if err := json.Unmarshal([]byte(line), &l); err == nil && l.Msg == "request" {
					logged[l.RequestID]++
				}
			}
			for id := range seen {
				if logged[id] != 1 {
					t.Errorf("request %s has %d log lines; want 1", id, logged[id])
				}
			}
			t.Logf("%d answers, %d distinct Request-Ids, %d request lines logged", len(seen), len(seen), len(logged))
		})
	}
}

// TestRequestIDWithoutLogRequests: the API alone (as tests and embedders
// mount it) still gives every answer a Request-Id and puts it in problems.
func TestRequestIDWithoutLogRequests(t *testing.T) {
	t.Parallel()
	inst := apitest.Start(t, apitest.SQLiteStore(t), apitest.Simulator(t, acquirer.Options{}), engine.Options{})
	for _, path := range []string{"/healthz", "/v1/charges/ch_nope"} {
		r, err := apitest.Do(t, nil, "GET", inst.URL+path, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		id := r.Header.Get("Request-Id")
		if !requestIDRE.MatchString(id) {
			t.Errorf("GET %s: Request-Id %q", path, id)
		}
		if r.Status >= 400 && !bytes.Contains(r.Body, []byte(`"request_id":"`+id+`"`)) {
			t.Errorf("GET %s: problem %s lacks request_id %s", path, r.Body, id)
		}
	}
}

// TestNewRequestIDAllocatesOnce: every request gets an id, in one
// allocation, fewer than crypto/rand.Text and the prefix's concatenation
// made (two; under -race the race detector moves the id's array to the
// heap, and the counts are two against three), of the prefix and 26
// characters of the RFC 4648 base32 alphabet, each new.
func TestNewRequestIDAllocatesOnce(t *testing.T) {
	var sink string
	n := testing.AllocsPerRun(100, func() { sink = httpapi.NewRequestID() })
	before := testing.AllocsPerRun(100, func() { sink = httpapi.RequestIDPrefix + rand.Text() })
	if n >= before {
		t.Fatalf("NewRequestID allocates %.0f times, as many as the prefix and crypto/rand.Text (%.0f)", n, before)
	}
	_ = sink
	seen := map[string]bool{}
	for range 1000 {
		id := httpapi.NewRequestID()
		rest, ok := strings.CutPrefix(id, httpapi.RequestIDPrefix)
		if !ok || len(rest) != 26 || strings.Trim(rest, "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567") != "" || seen[id] {
			t.Fatalf("request id %q: want %s and 26 new characters of [A-Z2-7]", id, httpapi.RequestIDPrefix)
		}
		seen[id] = true
	}
}
