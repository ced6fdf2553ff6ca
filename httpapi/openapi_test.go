package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pb33f/libopenapi"
	validator "github.com/pb33f/libopenapi-validator"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/httpapi"
	"github.com/chargeonce/chargeonce/internal/apitest"
	"github.com/chargeonce/chargeonce/metrics"
	"github.com/chargeonce/chargeonce/replaycache"
	"github.com/chargeonce/chargeonce/wire"
)

// pendingDivergences are answers where the document follows SPEC and the
// code does not yet: work another branch is doing. Each must still diverge,
// and only in the way named by want (a substring of the validation errors):
// once the code catches up, the test fails and asks for the entry to be
// deleted, so the list can only shrink.
var pendingDivergences = map[string]struct{ want, why string }{}

// notYetExercisable are documented answers (and problem slugs) that no
// request can provoke with the code as it is. Each must still be
// unexercised: once a request provokes one, the test fails and asks for the
// entry to be deleted.
var notYetExercisable = map[string]string{
	"POST /v1/charges/{id}/refunds 409": "a refund at the simulator settles under its lock at once: no second attempt can find it in flight (the engine's answerExisting, shared with charges, answers it)",
	"POST /v1/charges/{id}/refunds 503": "needs a database that fails the refund's insert; charges exercise the same answer",
	"POST /v1/charges/{id}/capture 503": "needs a database that fails the capture's insert; charges exercise the same answer",
	"POST /v1/charges/{id}/cancel 503":  "needs a database that fails the cancel's insert; charges exercise the same answer",
	"POST /v1/charges/{id}/capture 402": "the database admits a capture only of an open authorization within its amount, so the simulator never refuses one (acquirer/capture_test.go covers its refusals)",
	"POST /v1/charges/{id}/cancel 402":  "the database admits a cancel only of an open authorization, so the simulator never refuses one",
	"slug operation-failed":             "the answer of a capture or cancel the acquirer refused: see POST /v1/charges/{id}/capture 402",
}

// loadOpenAPI parses the embedded document and builds a validator for it.
func loadOpenAPI(t *testing.T) (libopenapi.Document, validator.Validator) {
	t.Helper()
	doc, err := libopenapi.NewDocument(httpapi.OpenAPI)
	if err != nil {
		t.Fatalf("parsing httpapi/openapi.yaml: %v", err)
	}
	v, errs := validator.NewValidator(doc)
	if len(errs) > 0 {
		t.Fatalf("building a validator for httpapi/openapi.yaml: %v", errors.Join(errs...))
	}
	return doc, v
}

func TestOpenAPIDocumentValidatesAgainstTheOpenAPISchema(t *testing.T) {
	t.Parallel()
	doc, v := loadOpenAPI(t)
	if got := doc.GetVersion(); got != "3.1.0" {
		t.Fatalf("openapi version = %q, want 3.1.0", got)
	}
	ok, verrs := v.ValidateDocument()
	if !ok {
		for _, e := range verrs {
			t.Errorf("openapi.yaml: %s: %s (line %d, col %d)", e.Message, e.Reason, e.SpecLine, e.SpecCol)
			for _, se := range e.SchemaValidationErrors {
				t.Errorf("  %s at %s", se.Reason, se.KeywordLocation)
			}
		}
	}
}

// documented returns every "METHOD /path STATUS" the document declares and
// every problem slug its Problem schema lists.
func documented(t *testing.T, doc libopenapi.Document) (responses, slugs []string) {
	t.Helper()
	m, err := doc.BuildV3Model()
	if err != nil {
		t.Fatalf("building the v3 model: %v", err)
	}
	for path, item := range m.Model.Paths.PathItems.FromOldest() {
		for method, op := range item.GetOperations().FromOldest() {
			for code := range op.Responses.Codes.FromOldest() {
				responses = append(responses, fmt.Sprintf("%s %s %s", strings.ToUpper(method), path, code))
			}
		}
	}
	problem := m.Model.Components.Schemas.GetOrZero("Problem")
	if problem == nil {
		t.Fatal("the document has no Problem schema")
	}
	typ := problem.Schema().Properties.GetOrZero("type")
	if typ == nil {
		t.Fatal("the Problem schema has no type property")
	}
	for _, n := range typ.Schema().Enum {
		slug, ok := strings.CutPrefix(n.Value, chargeonce.ProblemTypeBase)
		if !ok {
			t.Fatalf("problem type %q does not start with %s", n.Value, chargeonce.ProblemTypeBase)
		}
		slugs = append(slugs, slug)
	}
	if len(responses) == 0 || len(slugs) == 0 {
		t.Fatalf("the document declares %d responses and %d slugs", len(responses), len(slugs))
	}
	return responses, slugs
}

// conformance sends requests to real servers and validates every answer.
type conformance struct {
	t *testing.T
	v validator.Validator

	mu        sync.Mutex
	valid     map[string]int // "METHOD /path STATUS" -> answers that validated
	invalid   map[string][]string
	slugsSeen map[string]bool
}

// exchange sends one request to baseURL+target and validates the answer
// against the operation at route (the document's path template). When
// validRequest is set the request itself must validate too: the document
// must accept what the server accepts.
func (c *conformance) exchange(baseURL, method, route, target string, body []byte, headers map[string]string, validRequest bool) apitest.Result {
	c.t.Helper()
	newReq := func() *http.Request {
		var rd io.Reader
		if body != nil {
			rd = bytes.NewReader(body)
		}
		req, err := http.NewRequestWithContext(context.Background(), method, baseURL+target, rd)
		if err != nil {
			panic(err) // the test's own URLs are well-formed
		}
		req.Header.Set("Authorization", "Bearer "+apitest.APIKey)
		if body != nil {
			req.Header.Set("Content-Type", "application/json")
		}
		for k, v := range headers {
			if v == "" {
				req.Header.Del(k)
				continue
			}
			req.Header.Set(k, v)
		}
		return req
	}
	// Errorf, not Fatalf: exchange also runs on a goroutine of its own.
	resp, err := http.DefaultClient.Do(newReq())
	if err != nil {
		c.t.Errorf("%s %s: %v", method, target, err)
		return apitest.Result{}
	}
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		c.t.Errorf("%s %s: reading the answer: %v", method, target, err)
		return apitest.Result{}
	}
	res := apitest.Result{Status: resp.StatusCode, Header: resp.Header, Body: got}

	var msgs []string
	if validRequest {
		if ok, verrs := c.v.ValidateHttpRequestSync(newReq()); !ok {
			for _, e := range verrs {
				msgs = append(msgs, "request: "+e.Message+": "+e.Reason)
			}
		}
	}
	resp.Body = io.NopCloser(bytes.NewReader(got))
	if ok, verrs := c.v.ValidateHttpResponse(newReq(), resp); !ok {
		for _, e := range verrs {
			msg := "response: " + e.Message + ": " + e.Reason
			for _, se := range e.SchemaValidationErrors {
				msg += "; " + se.Reason + " at " + se.FieldPath + " (" + se.KeywordLocation + ")"
			}
			msgs = append(msgs, msg)
		}
	}
	key := fmt.Sprintf("%s %s %d", method, route, resp.StatusCode)
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(msgs) > 0 {
		c.invalid[key] = append(c.invalid[key], fmt.Sprintf("%s %s → %d %s\n    %s", method, target, resp.StatusCode, got, strings.Join(msgs, "\n    ")))
		return res
	}
	c.valid[key]++
	if strings.HasSuffix(resp.Header.Get("Content-Type"), "problem+json") {
		var p struct{ Type string }
		if json.Unmarshal(got, &p) == nil {
			c.slugsSeen[strings.TrimPrefix(p.Type, chargeonce.ProblemTypeBase)] = true
		}
	}
	return res
}

// brokenStore answers the API's reads, and the claim of a record whose lease
// ended, with an error that carries no code: a bug, which the API must show
// as 500 internal-error. (A failed insert is different: it may have
// committed, so the API answers 503 unavailable, retry with the same key.)
type brokenStore struct{ chargeonce.Store }

var errInjectedBug = errors.New("injected bug (openapi conformance test)")

func (brokenStore) ChargeGet(context.Context, string, string) (chargeonce.Charge, error) {
	return chargeonce.Charge{}, errInjectedBug
}

func (brokenStore) ChargesListByOrder(context.Context, string, int64) ([]chargeonce.Charge, error) {
	return nil, errInjectedBug
}

func (brokenStore) ChargesList(context.Context, chargeonce.ChargesListParams) (chargeonce.ChargesPage, error) {
	return chargeonce.ChargesPage{}, errInjectedBug
}

// KeyInsert finds an orphan of the same request whose lease has ended, so
// that the engine claims it.
func (brokenStore) KeyInsert(_ context.Context, p chargeonce.KeyInsertParams) (chargeonce.KeyRecord, bool, error) {
	return chargeonce.KeyRecord{
		MerchantID: p.Charge.MerchantID, Key: p.Charge.IdempotencyKey, Fingerprint: p.Fingerprint,
		State: chargeonce.KeyProcessing, LeaseExpired: true, Charge: p.Charge,
	}, false, nil
}

func (brokenStore) KeyClaim(context.Context, string, string, string, time.Duration) (chargeonce.KeyRecord, bool, error) {
	return chargeonce.KeyRecord{}, false, errInjectedBug
}

// startLikeServe runs the API over store the way `chargeonce serve` wires it
// (replay cache, metrics, request logging), on a loopback listener.
func startLikeServe(t *testing.T, store chargeonce.Store, acq chargeonce.Acquirer, opts engine.Options) string {
	t.Helper()
	keys, err := httpapi.ParseKeys("demo:" + apitest.APIKey + ",other:" + apitest.OtherAPIKey)
	if err != nil {
		t.Fatal(err)
	}
	m := metrics.New()
	eng := engine.New(replaycache.New(store, replaycache.Options{}), acq, opts)
	api := httpapi.New(httpapi.Config{Engine: eng, Store: store, Keys: keys, Metrics: m.Handler(), Outcomes: m})
	srv := httptest.NewServer(httpapi.LogRequests(discardLogger(), api))
	t.Cleanup(srv.Close)
	return srv.URL
}

// heldReads is a store whose reads of a charge wait for gate, saying on
// entered that one arrived: a read held in flight.
type heldReads struct {
	chargeonce.Store
	entered chan struct{}
	gate    chan struct{}
}

func (h heldReads) ChargeGet(ctx context.Context, merchantID, id string) (chargeonce.Charge, error) {
	select {
	case h.entered <- struct{}{}:
	default:
	}
	select {
	case <-h.gate:
	case <-ctx.Done():
	}
	return h.Store.ChargeGet(ctx, merchantID, id)
}

// startWithReadShares is startLikeServe with reads shares per merchant.
func startWithReadShares(t *testing.T, store chargeonce.Store, acq chargeonce.Acquirer, opts engine.Options, shares int) string {
	t.Helper()
	keys, err := httpapi.ParseKeys("demo:" + apitest.APIKey + ",other:" + apitest.OtherAPIKey)
	if err != nil {
		t.Fatal(err)
	}
	eng := engine.New(store, acq, opts)
	srv := httptest.NewServer(httpapi.New(httpapi.Config{Engine: eng, Store: store, Keys: keys, MaxReadsPerMerchant: shares}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestOpenAPIConformance provokes every answer the API can give, on both
// stores, and validates each against httpapi/openapi.yaml: an answer the
// document does not describe fails, and so does a documented answer no
// request provoked.
func TestOpenAPIConformance(t *testing.T) {
	t.Parallel()
	doc, _ := loadOpenAPI(t)
	responses, slugs := documented(t, doc)
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			_, v := loadOpenAPI(t)
			c := &conformance{t: t, v: v, valid: map[string]int{}, invalid: map[string][]string{}, slugsSeen: map[string]bool{}}
			exerciseEverything(t, c, kind)
			c.verdict(responses, slugs)
		})
	}
}

func exerciseEverything(t *testing.T, c *conformance, kind string) {
	store := apitest.Store(t, kind)
	sim := apitest.Simulator(t, acquirer.Options{Slow: 1500 * time.Millisecond})
	opts := engine.Options{AcquirerTimeout: 5 * time.Second, Lease: 10 * time.Second}
	base := startLikeServe(t, store, sim, opts)
	key := func(name string) string { return fmt.Sprintf("oas-%s-%d", name, orderSeq.Add(1)) }
	post := func(k string, body string, headers map[string]string, validRequest bool) apitest.Result {
		h := map[string]string{"Idempotency-Key": k}
		for name, v := range headers {
			h[name] = v
		}
		var b []byte
		if body != "" {
			b = []byte(body)
		}
		return c.exchange(base, "POST", "/v1/charges", "/v1/charges", b, h, validRequest)
	}
	want := func(r apitest.Result, status int, what string) {
		t.Helper()
		if r.Status != status {
			t.Errorf("%s: status %d, want %d; body %s", what, r.Status, status, r.Body)
		}
	}

	// 409 first, in the background: a slow capture holds the key while a
	// retry arrives.
	slowOrder := orderSeq.Add(1)
	slowKey, slowBody := key("slow"), chargeBody(slowOrder, "tok_slow")
	slowDone := make(chan apitest.Result, 1)
	go func() { slowDone <- post(slowKey, slowBody, nil, true) }()
	apitest.Eventually(t, 5*time.Second, "the slow charge's record", func() bool {
		r, err := apitest.Do(t, nil, "GET", fmt.Sprintf("%s/v1/charges?order_id=%d", base, slowOrder), nil, nil)
		return err == nil && r.Status == 200 && bytes.Contains(r.Body, []byte(`"processing"`))
	})
	want(post(slowKey, slowBody, nil, true), 409, "retry while the first attempt is at the acquirer")

	// 503 overloaded: an instance with one acquirer slot, held by a slow
	// capture, sheds the next new charge after a short wait.
	tight := startLikeServe(t, apitest.Store(t, kind), sim, engine.Options{
		AcquirerTimeout: 5 * time.Second, Lease: 10 * time.Second, MaxInFlight: 1, AdmissionWait: 50 * time.Millisecond,
	})
	holdOrder := orderSeq.Add(1)
	holdDone := make(chan apitest.Result, 1)
	go func() {
		holdDone <- c.exchange(tight, "POST", "/v1/charges", "/v1/charges", []byte(chargeBody(holdOrder, "tok_slow")),
			map[string]string{"Idempotency-Key": key("hold")}, true)
	}()
	apitest.Eventually(t, 5*time.Second, "the slot-holding charge's record", func() bool {
		r, err := apitest.Do(t, nil, "GET", fmt.Sprintf("%s/v1/charges?order_id=%d", tight, holdOrder), nil, nil)
		return err == nil && r.Status == 200 && bytes.Contains(r.Body, []byte(`"processing"`))
	})
	want(c.exchange(tight, "POST", "/v1/charges", "/v1/charges", []byte(chargeBody(orderSeq.Add(1), "tok_ok")),
		map[string]string{"Idempotency-Key": key("shed")}, true), 503, "a new charge while every acquirer slot is busy")
	defer func() { want(<-holdDone, 201, "the slot-holding charge") }()

	// 429 rate-limited: an instance whose merchants may start one charge
	// a minute refuses the second.
	limited := startLikeServe(t, apitest.Store(t, kind), sim, engine.Options{
		AcquirerTimeout: 5 * time.Second, Lease: 10 * time.Second, MerchantRate: engine.Rate{PerSecond: 1.0 / 60, Burst: 1},
	})
	for i, status := range []int{201, 429} {
		want(c.exchange(limited, "POST", "/v1/charges", "/v1/charges", []byte(chargeBody(orderSeq.Add(1), "tok_ok")),
			map[string]string{"Idempotency-Key": key("limited")}, true), status, fmt.Sprintf("charge %d at one a minute", i+1))
	}

	// 201, its replay, and the GETs that find it.
	order := orderSeq.Add(1)
	k := key("ok")
	created := post(k, chargeBody(order, "tok_ok"), nil, true)
	want(created, 201, "tok_ok")
	replay := post(k, chargeBody(order, "tok_ok"), nil, true)
	want(replay, 201, "replay")
	if replay.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("replay lacks Idempotent-Replayed: true: %v", replay.Header)
	}
	var ch struct{ ID string }
	if err := json.Unmarshal(created.Body, &ch); err != nil || ch.ID == "" {
		t.Fatalf("decoding the created charge %s: %v", created.Body, err)
	}
	want(c.exchange(base, "GET", "/v1/charges/{id}", "/v1/charges/"+ch.ID, nil, nil, true), 200, "GET a charge")
	want(c.exchange(base, "GET", "/v1/charges", fmt.Sprintf("/v1/charges?order_id=%d", order), nil, nil, true), 200, "list an order's charges")
	want(c.exchange(base, "GET", "/v1/charges", "/v1/charges?order_id=1", nil, nil, true), 200, "list an order with no charges")
	// A paginated list: a page of one with more, the next page after it,
	// and the page before that one.
	first := c.exchange(base, "GET", "/v1/charges", "/v1/charges?limit=1", nil, nil, true)
	want(first, 200, "list a page of one")
	var page struct {
		Data    []struct{ ID string }
		HasMore bool `json:"has_more"`
	}
	if err := json.Unmarshal(first.Body, &page); err != nil || len(page.Data) != 1 || !page.HasMore {
		t.Fatalf("a page of one of several charges = %s (%v), want one charge and has_more", first.Body, err)
	}
	next := c.exchange(base, "GET", "/v1/charges", "/v1/charges?limit=1&status=captured&starting_after="+page.Data[0].ID, nil, nil, true)
	want(next, 200, "list the next page")
	want(c.exchange(base, "GET", "/v1/charges", fmt.Sprintf("/v1/charges?limit=100&order_id=%d&ending_before=%s", order, page.Data[0].ID), nil, nil, true), 200, "list the page before")

	// 402 and its replay; 202; 422.
	dk, dbody := key("declined"), chargeBody(orderSeq.Add(1), "tok_declined")
	want(post(dk, dbody, nil, true), 402, "tok_declined")
	want(post(dk, dbody, nil, true), 402, "declined replay")
	want(post(key("unknown"), chargeBody(orderSeq.Add(1), "tok_fail_before"), nil, true), 202, "tok_fail_before")
	want(post(k, chargeBody(order+1, "tok_ok"), nil, true), 422, "same key, other body")

	exerciseRefunds(t, c, base, key)
	exerciseCapture(t, c, base, key)

	// 400 with every slug, 401, 413, 404, 405.
	want(post(key("bad"), `{"order_id": 1, "amount_cents": 1, "payment_token": "tok_ok", "tip": 1}`, nil, false), 400, "unknown field")
	want(post(key("bad"), `{"order_id": "1"`, nil, false), 400, "malformed JSON")
	want(post("", chargeBody(orderSeq.Add(1), "tok_ok"), nil, false), 400, "no Idempotency-Key")
	want(post("has space", chargeBody(orderSeq.Add(1), "tok_ok"), nil, false), 400, "malformed Idempotency-Key")
	want(c.exchange(base, "GET", "/v1/charges", "/v1/charges?order_id=abc", nil, nil, false), 400, "order_id not a number")
	want(c.exchange(base, "GET", "/v1/charges", "/v1/charges", nil, nil, true), 200, "list every order's charges")
	want(c.exchange(base, "GET", "/v1/charges", "/v1/charges?limit=101", nil, nil, false), 400, "limit over 100")
	want(c.exchange(base, "GET", "/v1/charges", "/v1/charges?offset=10", nil, nil, false), 400, "unknown query parameter")
	want(c.exchange(base, "GET", "/v1/charges", "/v1/charges?starting_after=ch_nope", nil, nil, true), 400, "cursor not a charge")
	want(post(key("auth"), chargeBody(orderSeq.Add(1), "tok_ok"), map[string]string{"Authorization": ""}, false), 401, "no API key")
	want(post(key("auth"), chargeBody(orderSeq.Add(1), "tok_ok"), map[string]string{"Authorization": "Bearer sk_wrong"}, false), 401, "unknown API key")
	want(c.exchange(base, "GET", "/v1/charges/{id}", "/v1/charges/"+ch.ID, nil, map[string]string{"Authorization": "Basic eDp5"}, false), 401, "GET with a Basic credential")
	want(c.exchange(base, "GET", "/v1/charges", "/v1/charges?order_id=1", nil, map[string]string{"Authorization": ""}, false), 401, "list without a key")
	big := fmt.Sprintf(`{"order_id": 1, "amount_cents": 1, "payment_token": "tok_ok", "description": %q}`, strings.Repeat("x", wire.MaxBodyBytes))
	want(post(key("big"), big, nil, false), 413, "body over 64 KiB")
	want(c.exchange(base, "GET", "/v1/charges/{id}", "/v1/charges/ch_00000000000000000000000000", nil, nil, true), 404, "no such charge")
	want(c.exchange(base, "GET", "/v1/charges/{id}", "/v1/charges/"+ch.ID, nil, map[string]string{"Authorization": "Bearer " + apitest.OtherAPIKey}, true), 404, "another merchant's charge")
	for _, m := range []string{"PUT", "PATCH", "DELETE"} {
		want(c.exchange(base, m, "/v1/charges", "/v1/charges", nil, nil, false), 405, m+" /v1/charges")
	}
	for _, m := range []string{"POST", "PUT", "PATCH", "DELETE"} {
		want(c.exchange(base, m, "/v1/charges/{id}", "/v1/charges/"+ch.ID, nil, nil, false), 405, m+" /v1/charges/{id}")
	}

	// Webhook endpoints and events.
	ep := c.exchange(base, "POST", "/v1/webhook_endpoints", "/v1/webhook_endpoints",
		[]byte(`{"url":"https://hooks.example.com/chargeonce","description":"orders"}`), nil, true)
	want(ep, 201, "create a webhook endpoint")
	var endpoint struct{ ID, Secret string }
	if err := json.Unmarshal(ep.Body, &endpoint); err != nil || endpoint.ID == "" || endpoint.Secret == "" {
		t.Fatalf("created endpoint %s: %v", ep.Body, err)
	}
	want(c.exchange(base, "POST", "/v1/webhook_endpoints", "/v1/webhook_endpoints",
		[]byte(`{"url":"http://169.254.169.254/latest"}`), nil, true), 400, "an endpoint at the metadata address")
	want(c.exchange(base, "POST", "/v1/webhook_endpoints", "/v1/webhook_endpoints",
		[]byte(`{"url":"https://a.example.com","description":"x"}`), map[string]string{"Authorization": ""}, false), 401, "create an endpoint without a key")
	want(c.exchange(base, "GET", "/v1/webhook_endpoints", "/v1/webhook_endpoints", nil, nil, true), 200, "list endpoints")
	want(c.exchange(base, "GET", "/v1/webhook_endpoints", "/v1/webhook_endpoints", nil, map[string]string{"Authorization": ""}, false), 401, "list endpoints without a key")
	want(c.exchange(base, "GET", "/v1/webhook_endpoints/{id}", "/v1/webhook_endpoints/"+endpoint.ID, nil, nil, true), 200, "read an endpoint")
	want(c.exchange(base, "GET", "/v1/webhook_endpoints/{id}", "/v1/webhook_endpoints/we_nope", nil, nil, true), 404, "read no endpoint")
	want(c.exchange(base, "GET", "/v1/webhook_endpoints/{id}", "/v1/webhook_endpoints/"+endpoint.ID, nil, map[string]string{"Authorization": ""}, false), 401, "read an endpoint without a key")
	want(c.exchange(base, "POST", "/v1/webhook_endpoints/{id}/rotate_secret", "/v1/webhook_endpoints/"+endpoint.ID+"/rotate_secret", nil, nil, true), 200, "rotate a secret")
	want(c.exchange(base, "POST", "/v1/webhook_endpoints/{id}/rotate_secret", "/v1/webhook_endpoints/we_nope/rotate_secret", nil, nil, true), 404, "rotate no endpoint")
	settled := post(key("evented"), chargeBody(orderSeq.Add(1), "tok_ok"), nil, true)
	want(settled, 201, "a charge settled with an endpoint")
	var evCharge struct{ ID string }
	_ = json.Unmarshal(settled.Body, &evCharge)
	evs := c.exchange(base, "GET", "/v1/events", "/v1/events?charge_id="+evCharge.ID, nil, nil, true)
	want(evs, 200, "list a charge's events")
	var evPage struct{ Data []struct{ ID string } }
	if err := json.Unmarshal(evs.Body, &evPage); err != nil || len(evPage.Data) != 1 {
		t.Fatalf("events of charge %s: %s (%v), want one", evCharge.ID, evs.Body, err)
	}
	want(c.exchange(base, "GET", "/v1/events", "/v1/events?limit=0", nil, nil, false), 400, "list events with limit 0")
	want(c.exchange(base, "GET", "/v1/events/{id}", "/v1/events/"+evPage.Data[0].ID, nil, nil, true), 200, "get an event")
	want(c.exchange(base, "GET", "/v1/events/{id}", "/v1/events/evt_00", nil, nil, true), 404, "get no event")
	want(c.exchange(base, "POST", "/v1/events/{id}/redeliver", "/v1/events/"+evPage.Data[0].ID+"/redeliver", nil, nil, true), 202, "redeliver an event")
	want(c.exchange(base, "POST", "/v1/events/{id}/redeliver", "/v1/events/evt_00/redeliver", nil, nil, true), 404, "redeliver no event")
	want(c.exchange(base, "GET", "/v1/events/{id}/attempts", "/v1/events/"+evPage.Data[0].ID+"/attempts?limit=5", nil, nil, true), 200, "list an event's attempts")
	want(c.exchange(base, "GET", "/v1/events/{id}/attempts", "/v1/events/"+evPage.Data[0].ID+"/attempts?starting_after=nope", nil, nil, false), 400, "attempts after no attempt")
	want(c.exchange(base, "GET", "/v1/events/{id}/attempts", "/v1/events/evt_00/attempts", nil, nil, true), 404, "attempts of no event")
	want(c.exchange(base, "POST", "/v1/webhook_endpoints/{id}", "/v1/webhook_endpoints/"+endpoint.ID, []byte(`{"disabled":true}`), nil, true), 200, "disable an endpoint")
	want(c.exchange(base, "POST", "/v1/webhook_endpoints/{id}/recover", "/v1/webhook_endpoints/"+endpoint.ID+"/recover", []byte(`{"since":"2026-01-01T00:00:00Z"}`), nil, true), 400, "recover to a disabled endpoint")
	want(c.exchange(base, "POST", "/v1/webhook_endpoints/{id}", "/v1/webhook_endpoints/"+endpoint.ID, []byte(`{"disabled":false,"enabled_events":["charge.captured"]}`), nil, true), 200, "enable it again")
	want(c.exchange(base, "POST", "/v1/webhook_endpoints/{id}", "/v1/webhook_endpoints/"+endpoint.ID, []byte(`{"disabled":"no"}`), nil, false), 400, "update with a bad field")
	want(c.exchange(base, "POST", "/v1/webhook_endpoints/{id}", "/v1/webhook_endpoints/we_nope", []byte(`{"disabled":false}`), nil, true), 404, "update no endpoint")
	want(c.exchange(base, "POST", "/v1/webhook_endpoints/{id}/recover", "/v1/webhook_endpoints/"+endpoint.ID+"/recover", []byte(`{"since":"2026-01-01T00:00:00Z"}`), nil, true), 202, "recover failed deliveries")
	want(c.exchange(base, "POST", "/v1/webhook_endpoints/{id}/recover", "/v1/webhook_endpoints/we_nope/recover", []byte(`{"since":"2026-01-01T00:00:00Z"}`), nil, true), 404, "recover no endpoint")
	// A test event to a name that never resolves (RFC 6761 .invalid): the
	// attempt fails at once, and the answer says so.
	invalid := c.exchange(base, "POST", "/v1/webhook_endpoints", "/v1/webhook_endpoints", []byte(`{"url":"https://hooks.example.invalid/"}`), nil, true)
	var invalidEndpoint struct{ ID string }
	_ = json.Unmarshal(invalid.Body, &invalidEndpoint)
	want(c.exchange(base, "POST", "/v1/webhook_endpoints/{id}/test", "/v1/webhook_endpoints/"+invalidEndpoint.ID+"/test", nil, nil, true), 200, "send a test event")
	want(c.exchange(base, "POST", "/v1/webhook_endpoints/{id}/test", "/v1/webhook_endpoints/we_nope/test", nil, nil, true), 404, "test no endpoint")
	want(c.exchange(base, "DELETE", "/v1/webhook_endpoints/{id}", "/v1/webhook_endpoints/"+endpoint.ID, nil, nil, true), 204, "delete an endpoint")
	want(c.exchange(base, "DELETE", "/v1/webhook_endpoints/{id}", "/v1/webhook_endpoints/"+endpoint.ID, nil, nil, true), 404, "delete it again")
	// Over the webhook routes' rate: another merchant spends its burst,
	// then each route answers it 429.
	otherKey := map[string]string{"Authorization": "Bearer " + apitest.OtherAPIKey}
	spend := func() {
		for i := 0; ; i++ {
			r, err := apitest.Do(t, nil, "GET", base+"/v1/webhook_endpoints", nil, otherKey)
			if err != nil || i > 1000 {
				t.Fatalf("spending the webhook routes' burst: %d requests, %v", i, err)
			}
			if r.Status == http.StatusTooManyRequests {
				return
			}
		}
	}
	for _, rt := range []struct{ method, route, target string }{
		{"POST", "/v1/webhook_endpoints", "/v1/webhook_endpoints"},
		{"GET", "/v1/webhook_endpoints", "/v1/webhook_endpoints"},
		{"DELETE", "/v1/webhook_endpoints/{id}", "/v1/webhook_endpoints/we_nope"},
		{"POST", "/v1/webhook_endpoints/{id}/rotate_secret", "/v1/webhook_endpoints/we_nope/rotate_secret"},
		{"GET", "/v1/events", "/v1/events"},
		{"GET", "/v1/events/{id}", "/v1/events/evt_00"},
		{"POST", "/v1/events/{id}/redeliver", "/v1/events/evt_00/redeliver"},
		{"GET", "/v1/events/{id}/attempts", "/v1/events/evt_00/attempts"},
		{"POST", "/v1/webhook_endpoints/{id}", "/v1/webhook_endpoints/we_nope"},
		{"POST", "/v1/webhook_endpoints/{id}/recover", "/v1/webhook_endpoints/we_nope/recover"},
		{"POST", "/v1/webhook_endpoints/{id}/test", "/v1/webhook_endpoints/we_nope/test"},
		{"GET", "/v1/webhook_endpoints/{id}", "/v1/webhook_endpoints/we_nope"},
	} {
		var body []byte
		switch rt.route {
		case "/v1/webhook_endpoints":
			if rt.method == "POST" {
				body = []byte(`{"url":"https://a.example.com/"}`)
			}
		case "/v1/webhook_endpoints/{id}":
			if rt.method == "POST" {
				body = []byte(`{"disabled":false}`)
			}
		case "/v1/webhook_endpoints/{id}/recover":
			body = []byte(`{"since":"2026-01-01T00:00:00Z"}`)
		}
		// The bucket refills 20 tokens a second: on a loaded machine one
		// may come back between spending the last and the request, so the
		// burst is spent again and the request repeated, up to 20 times.
		for try := 0; ; try++ {
			spend()
			r := c.exchange(base, rt.method, rt.route, rt.target, body, otherKey, true)
			if r.Status == http.StatusTooManyRequests || try == 19 {
				want(r, 429, rt.method+" "+rt.route+" over the rate")
				break
			}
		}
	}

	// 429 on the reads: past its share of reads in flight, a merchant's
	// read waits a second for one, then is refused. A read held in the
	// store keeps the merchant's only share.
	held := heldReads{Store: apitest.Store(t, kind), entered: make(chan struct{}, 1), gate: make(chan struct{})}
	shared := startWithReadShares(t, held, sim, opts, 1)
	holding := make(chan struct{})
	go func() {
		defer close(holding)
		_, _ = apitest.Do(t, nil, "GET", shared+"/v1/charges/ch_held", nil, nil)
	}()
	select {
	case <-held.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the held read never reached the store")
	}
	for _, rt := range []struct{ route, target string }{
		{"/v1/charges", "/v1/charges"},
		{"/v1/charges/{id}", "/v1/charges/ch_other"},
		{"/v1/refunds", "/v1/refunds"},
		{"/v1/refunds/{id}", "/v1/refunds/re_other"},
	} {
		want(c.exchange(shared, "GET", rt.route, rt.target, nil, nil, true), 429, "GET "+rt.route+" past the merchant's share of reads")
	}
	close(held.gate)
	<-holding

	// Operations.
	for _, p := range []string{"/healthz", "/readyz", "/metrics", "/openapi.yaml"} {
		want(c.exchange(base, "GET", p, p, nil, map[string]string{"Authorization": ""}, true), 200, p)
	}

	// 500: a store with a bug behind a real API.
	broken := startLikeServe(t, brokenStore{apitest.Store(t, kind)}, sim, opts)
	want(c.exchange(broken, "GET", "/v1/charges/{id}", "/v1/charges/"+ch.ID, nil, nil, true), 500, "GET on a store with a bug")
	want(c.exchange(broken, "GET", "/v1/charges", "/v1/charges?order_id=1", nil, nil, true), 500, "list on a store with a bug")
	r := c.exchange(broken, "POST", "/v1/charges", "/v1/charges", []byte(chargeBody(orderSeq.Add(1), "tok_ok")), map[string]string{"Idempotency-Key": key("bug")}, true)
	want(r, 500, "POST whose claim hits a store with a bug")

	// The database closed under a running server: whatever each endpoint
	// answers must be documented.
	closed := apitest.Store(t, kind)
	down := startLikeServe(t, closed, sim, opts)
	if err := closed.Close(); err != nil {
		t.Fatalf("closing the store: %v", err)
	}
	for _, p := range []string{"/readyz", "/healthz"} {
		c.exchange(down, "GET", p, p, nil, nil, true)
	}
	c.exchange(down, "GET", "/v1/charges/{id}", "/v1/charges/"+ch.ID, nil, nil, true)
	c.exchange(down, "GET", "/v1/charges", "/v1/charges?order_id=1", nil, nil, true)
	c.exchange(down, "POST", "/v1/charges", "/v1/charges", []byte(chargeBody(orderSeq.Add(1), "tok_ok")), map[string]string{"Idempotency-Key": key("down")}, true)

	select {
	case r := <-slowDone:
		want(r, 201, "the slow charge")
	case <-time.After(10 * time.Second):
		t.Fatal("the slow charge did not finish in 10s")
	}
}

// verdict fails the test for every answer that did not validate (outside
// pendingDivergences), every documented answer and slug never provoked
// (outside notYetExercisable), and every entry of either list that no
// longer holds.
func (c *conformance) verdict(responses, slugs []string) {
	t := c.t
	c.mu.Lock()
	defer c.mu.Unlock()
	for key, fails := range c.invalid {
		if p, ok := pendingDivergences[key]; ok {
			if all := strings.Join(fails, "\n"); strings.Contains(all, p.want) {
				t.Logf("pending divergence %q (%s):\n  %s", key, p.why, all)
				continue
			}
		}
		t.Errorf("%s: %d answers do not match httpapi/openapi.yaml:\n  %s", key, len(fails), strings.Join(fails, "\n  "))
	}
	for key, p := range pendingDivergences {
		if c.valid[key] > 0 {
			t.Errorf("%q now matches the document (%s): delete it from pendingDivergences", key, p.why)
		}
	}
	var missing []string
	for _, key := range responses {
		_, pending := pendingDivergences[key]
		_, later := notYetExercisable[key]
		switch {
		case c.valid[key] > 0 && later:
			t.Errorf("%q is exercised now: delete it from notYetExercisable", key)
		case c.valid[key] == 0 && !pending && !later:
			missing = append(missing, key)
		}
	}
	for _, s := range slugs {
		_, later := notYetExercisable["slug "+s]
		switch {
		case c.slugsSeen[s] && later:
			t.Errorf("slug %q is exercised now: delete it from notYetExercisable", s)
		case !c.slugsSeen[s] && !later:
			missing = append(missing, "slug "+s)
		}
	}
	for key := range notYetExercisable {
		if !strings.HasPrefix(key, "slug ") && !slices.Contains(responses, key) {
			t.Errorf("notYetExercisable names %q, which the document does not declare", key)
		}
	}
	for key := range pendingDivergences {
		if !slices.Contains(responses, key) {
			t.Errorf("pendingDivergences names %q, which the document does not declare", key)
		}
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		t.Errorf("documented but never provoked by this test (add a request, or fix the document):\n  %s", strings.Join(missing, "\n  "))
	}
	n := 0
	for _, v := range c.valid {
		n += v
	}
	t.Logf("%d answers validated against httpapi/openapi.yaml, covering %d of %d documented responses", n, len(c.valid), len(responses))
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }
