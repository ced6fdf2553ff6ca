package httpapi_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/internal/apitest"
)

// TestClientMistakes sends every kind of bad request and checks the status,
// the problem type, the named field, and that nothing was stored and the
// acquirer was never called.
func TestClientMistakes(t *testing.T) {
	t.Parallel()
	const order = 777001
	ok := func(extra string) string {
		return fmt.Sprintf(`{"order_id": %d, "amount_cents": 100, "payment_token": "tok_ok"%s}`, order, extra)
	}
	cases := []struct {
		name    string
		body    string
		headers map[string]string
		status  int
		slug    string
		field   string
	}{
		{name: "malformed JSON", body: `{"order_id": 1,`, status: 400, slug: "validation-failed"},
		{name: "not JSON", body: `order_id=1`, status: 400, slug: "validation-failed"},
		{name: "empty body", body: ``, status: 400, slug: "validation-failed"},
		{name: "array body", body: `[1,2]`, status: 400, slug: "validation-failed"},
		{name: "null body", body: `null`, status: 400, slug: "validation-failed", field: "order_id"},
		{name: "trailing data", body: ok("") + ` {}`, status: 400, slug: "validation-failed"},
		{name: "unknown field", body: ok(`, "amount": 5`), status: 400, slug: "validation-failed", field: "amount"},
		{name: "name in another case", body: ok(`, "Amount_Cents": 1`), status: 400, slug: "validation-failed", field: "Amount_Cents"},
		{name: "upper-case names", body: fmt.Sprintf(`{"order_id": %d, "AMOUNT_CENTS": 7, "payment_token": "tok_ok"}`, order), status: 400, slug: "validation-failed", field: "AMOUNT_CENTS"},
		{name: "duplicate name", body: fmt.Sprintf(`{"order_id": %d, "amount_cents": 1, "amount_cents": 999999, "payment_token": "tok_ok"}`, order), status: 400, slug: "validation-failed", field: "amount_cents"},
		{name: "duplicate name, escaped", body: fmt.Sprintf(`{"order_id": %d, "amount_cents": 1, "amount_c\u0065nts": 999999, "payment_token": "tok_ok"}`, order), status: 400, slug: "validation-failed", field: "amount_cents"},
		{name: "order_id as string", body: `{"order_id": "1", "amount_cents": 100, "payment_token": "tok_ok"}`, status: 400, slug: "validation-failed", field: "order_id"},
		{name: "amount as float", body: fmt.Sprintf(`{"order_id": %d, "amount_cents": 1.5, "payment_token": "tok_ok"}`, order), status: 400, slug: "validation-failed", field: "amount_cents"},
		{name: "amount overflows int64", body: fmt.Sprintf(`{"order_id": %d, "amount_cents": 9223372036854775808, "payment_token": "tok_ok"}`, order), status: 400, slug: "validation-failed", field: "amount_cents"},
		{name: "order_id overflows int64", body: `{"order_id": 99999999999999999999, "amount_cents": 1, "payment_token": "tok_ok"}`, status: 400, slug: "validation-failed", field: "order_id"},
		{name: "negative amount", body: fmt.Sprintf(`{"order_id": %d, "amount_cents": -5, "payment_token": "tok_ok"}`, order), status: 400, slug: "validation-failed", field: "amount_cents"},
		{name: "zero order_id", body: `{"order_id": 0, "amount_cents": 5, "payment_token": "tok_ok"}`, status: 400, slug: "validation-failed", field: "order_id"},
		{name: "missing order_id", body: `{"amount_cents": 5, "payment_token": "tok_ok"}`, status: 400, slug: "validation-failed", field: "order_id"},
		{name: "currency of two letters", body: ok(`, "currency": "br"`), status: 400, slug: "validation-failed", field: "currency"},
		{name: "unknown currency", body: ok(`, "currency": "XYZ"`), status: 400, slug: "validation-failed", field: "currency"},
		{name: "currency as number", body: ok(`, "currency": 986`), status: 400, slug: "validation-failed", field: "currency"},
		{name: "empty token", body: fmt.Sprintf(`{"order_id": %d, "amount_cents": 5, "payment_token": ""}`, order), status: 400, slug: "validation-failed", field: "payment_token"},
		{name: "missing token", body: fmt.Sprintf(`{"order_id": %d, "amount_cents": 5}`, order), status: 400, slug: "validation-failed", field: "payment_token"},
		{name: "token with space", body: fmt.Sprintf(`{"order_id": %d, "amount_cents": 5, "payment_token": "tok ok"}`, order), status: 400, slug: "validation-failed", field: "payment_token"},
		{name: "token too long", body: fmt.Sprintf(`{"order_id": %d, "amount_cents": 5, "payment_token": %q}`, order, strings.Repeat("t", 256)), status: 400, slug: "validation-failed", field: "payment_token"},
		{name: "metadata value not a string", body: ok(`, "metadata": {"a": 1}`), status: 400, slug: "validation-failed", field: "metadata"},
		{name: "metadata name twice", body: ok(`, "metadata": {"a": "1", "a": "2"}`), status: 400, slug: "validation-failed", field: "metadata"},
		{name: "metadata key too long", body: ok(fmt.Sprintf(`, "metadata": {%q: "x"}`, strings.Repeat("k", 41))), status: 400, slug: "validation-failed", field: "metadata"},
		{name: "metadata empty key", body: ok(`, "metadata": {"": "x"}`), status: 400, slug: "validation-failed", field: "metadata"},
		{name: "metadata value too long", body: ok(fmt.Sprintf(`, "metadata": {"k": %q}`, strings.Repeat("é", 501))), status: 400, slug: "validation-failed", field: "metadata"},
		{name: "metadata NUL", body: ok(`, "metadata": {"k": "a\u0000"}`), status: 400, slug: "validation-failed", field: "metadata"},
		{name: "metadata too many entries", body: ok(`, "metadata": {"k0": "v","k1": "v","k2": "v","k3": "v","k4": "v","k5": "v","k6": "v","k7": "v","k8": "v","k9": "v","k10": "v","k11": "v","k12": "v","k13": "v","k14": "v","k15": "v","k16": "v","k17": "v","k18": "v","k19": "v","k20": "v"}`), status: 400, slug: "validation-failed", field: "metadata"},
		{name: "description too long", body: ok(fmt.Sprintf(`, "description": %q`, strings.Repeat("é", 501))), status: 400, slug: "validation-failed", field: "description"},
		{name: "missing key", body: ok(""), headers: map[string]string{"Idempotency-Key": ""}, status: 400, slug: "missing-idempotency-key"},
		{name: "key too long", body: ok(""), headers: map[string]string{"Idempotency-Key": strings.Repeat("k", 256)}, status: 400, slug: "invalid-idempotency-key"},
		{name: "non-ASCII key", body: ok(""), headers: map[string]string{"Idempotency-Key": "clé-1"}, status: 400, slug: "invalid-idempotency-key"},
		{name: "key with space", body: ok(""), headers: map[string]string{"Idempotency-Key": "a b"}, status: 400, slug: "invalid-idempotency-key"},
		{name: "unterminated quoted key", body: ok(""), headers: map[string]string{"Idempotency-Key": `"abc`}, status: 400, slug: "invalid-idempotency-key"},
		{name: "empty quoted key", body: ok(""), headers: map[string]string{"Idempotency-Key": `""`}, status: 400, slug: "invalid-idempotency-key"},
		{name: "quoted key with parameters", body: ok(""), headers: map[string]string{"Idempotency-Key": `"abc";v=1`}, status: 400, slug: "invalid-idempotency-key"},
		{name: "quoted key with space", body: ok(""), headers: map[string]string{"Idempotency-Key": `"a b"`}, status: 400, slug: "invalid-idempotency-key"},
		{name: "no API key", body: ok(""), headers: map[string]string{"Authorization": ""}, status: 401, slug: "unauthorized"},
		{name: "wrong API key", body: ok(""), headers: map[string]string{"Authorization": "Bearer sk_test_wrong"}, status: 401, slug: "unauthorized"},
		{name: "basic auth", body: ok(""), headers: map[string]string{"Authorization": "Basic ZGVtbzpzZWNyZXQ="}, status: 401, slug: "unauthorized"},
		{name: "oversized body", body: ok(fmt.Sprintf(`, "description": %q`, strings.Repeat("x", 70<<10))), status: 413, slug: "payload-too-large"},
	}
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			f := setup(t, kind, engine.Options{}, acquirer.Options{})
			for i, tc := range cases {
				key := fmt.Sprintf("mistake-%d", i)
				headers := map[string]string{"Idempotency-Key": key}
				for k, v := range tc.headers {
					headers[k] = v
				}
				r, err := apitest.Do(t, nil, "POST", f.inst.URL+"/v1/charges", []byte(tc.body), headers)
				if err != nil {
					t.Fatalf("%s: %v", tc.name, err)
				}
				p := wantProblemNamed(t, tc.name, r, tc.status, tc.slug)
				if tc.field != "" && p.Field != tc.field {
					t.Errorf("%s: problem field = %q, want %q (%s)", tc.name, p.Field, tc.field, p.Detail)
				}
				assertNothingStored(t, f, tc.name, key, order)
			}
			// Several Idempotency-Key headers, and a chunked oversized body
			// (no Content-Length to reject it early).
			req, _ := http.NewRequest("POST", f.inst.URL+"/v1/charges", strings.NewReader(ok("")))
			req.Header.Set("Authorization", "Bearer "+apitest.APIKey)
			req.Header.Add("Idempotency-Key", "two-a")
			req.Header.Add("Idempotency-Key", "two-b")
			wantProblemNamed(t, "two keys", send(t, req), 400, "invalid-idempotency-key")
			assertNothingStored(t, f, "two keys", "two-a", order)

			big := ok(fmt.Sprintf(`, "description": %q`, strings.Repeat("x", 70<<10)))
			req, _ = http.NewRequest("POST", f.inst.URL+"/v1/charges", io.MultiReader(strings.NewReader(big)))
			req.ContentLength = -1
			req.Header.Set("Authorization", "Bearer "+apitest.APIKey)
			req.Header.Set("Idempotency-Key", "chunked-big")
			wantProblemNamed(t, "chunked oversized", send(t, req), 413, "payload-too-large")
			assertNothingStored(t, f, "chunked oversized", "chunked-big", order)

			if st := f.sim.Stats(); st.CaptureRequests != 0 {
				t.Fatalf("a bad request reached the acquirer (%d requests)", st.CaptureRequests)
			}
		})
	}
}

func send(t *testing.T, req *http.Request) apitest.Result {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return apitest.Result{Status: resp.StatusCode, Header: resp.Header, Body: b}
}

func wantProblemNamed(t *testing.T, name string, r apitest.Result, status int, slug string) problem {
	t.Helper()
	if r.Status != status {
		t.Fatalf("%s: status = %d, want %d; body %s", name, r.Status, status, r.Body)
	}
	p := decodeProblem(t, r)
	if !strings.HasSuffix(p.Type, "/"+slug) {
		t.Fatalf("%s: problem type = %q, want it to end in %q", name, p.Type, slug)
	}
	return p
}

func assertNothingStored(t *testing.T, f fixture, name, key string, order int64) {
	t.Helper()
	ctx := context.Background()
	if rec, err := f.store.KeyGet(ctx, "demo", key); chargeonce.ErrorCode(err) != chargeonce.ENOTFOUND {
		t.Fatalf("%s: a record was left behind for key %q: %+v (%v)", name, key, rec, err)
	}
	if cs, err := f.store.ChargesListByOrder(ctx, "demo", order); err != nil || len(cs) != 0 {
		t.Fatalf("%s: charges left behind for order %d: %+v (%v)", name, order, cs, err)
	}
}

func TestOtherEndpointsAnswerProblems(t *testing.T) {
	t.Parallel()
	f := setup(t, "sqlite", engine.Options{}, acquirer.Options{})
	for _, tc := range []struct {
		method, path string
		headers      map[string]string
		status       int
		slug         string
	}{
		{"GET", "/v1/charges/ch_missing", nil, 404, "not-found"},
		{"GET", "/v1/charges?order_id=abc", nil, 400, "validation-failed"},
		{"GET", "/v1/charges?limit=0", nil, 400, "validation-failed"},
		{"GET", "/v1/charges/ch_x", map[string]string{"Authorization": ""}, 401, "unauthorized"},
		{"DELETE", "/v1/charges/ch_x", nil, 405, "method-not-allowed"},
		{"PUT", "/v1/charges", nil, 405, "method-not-allowed"},
		{"GET", "/v2/nothing", nil, 404, "not-found"},
	} {
		r, err := apitest.Do(t, nil, tc.method, f.inst.URL+tc.path, nil, tc.headers)
		if err != nil {
			t.Fatal(err)
		}
		wantProblemNamed(t, tc.method+" "+tc.path, r, tc.status, tc.slug)
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		r, err := apitest.Do(t, nil, "GET", f.inst.URL+path, nil, map[string]string{"Authorization": ""})
		if err != nil || r.Status != 200 {
			t.Fatalf("%s: %v %d %s", path, err, r.Status, r.Body)
		}
	}
}

// TestReadyzFailsWhenTheDatabaseIsGone closes the store under a running
// server: /readyz must say 503, not 200.
func TestReadyzFailsWhenTheDatabaseIsGone(t *testing.T) {
	t.Parallel()
	f := setup(t, "postgres", engine.Options{}, acquirer.Options{})
	f.store.Close()
	r, err := apitest.Do(t, nil, "GET", f.inst.URL+"/readyz", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	wantProblemNamed(t, "readyz", r, 503, "unavailable")
}

// failingInsertStore commits the insert but reports an error, as when the
// connection drops while COMMIT's answer is in flight.
type failingInsertStore struct {
	chargeonce.Store
}

func (s failingInsertStore) KeyInsert(ctx context.Context, p chargeonce.KeyInsertParams) (chargeonce.KeyRecord, bool, error) {
	_, _, err := s.Store.KeyInsert(ctx, p)
	if err != nil {
		return chargeonce.KeyRecord{}, false, err
	}
	return chargeonce.KeyRecord{}, false, fmt.Errorf("connection lost while committing")
}

// TestInternalErrorBeforeAcquirerReleasesKey: a failed insert answers 503
// unavailable with Retry-After (it may have committed: the outcome is
// unknown), and when the release gets through it leaves no record behind,
// so the retry with the same key starts afresh and charges.
func TestInternalErrorBeforeAcquirerReleasesKey(t *testing.T) {
	t.Parallel()
	store := apitest.Store(t, "postgres")
	sim := apitest.Simulator(t, acquirer.Options{})
	broken := apitest.Start(t, failingInsertStore{store}, sim, engine.Options{})
	healthy := apitest.Start(t, store, sim, engine.Options{})
	order := orderSeq.Add(1)
	r := apitest.Charge(t, broken.URL, "key-500", chargeBody(order, "tok_ok"))
	p := wantProblem(t, r, 503, "unavailable")
	if r.Header.Get("Retry-After") == "" {
		t.Fatal("503 without Retry-After")
	}
	if strings.Contains(p.Detail, "connection lost") {
		t.Fatalf("internal error text leaked to the client: %q", p.Detail)
	}
	if _, err := store.KeyGet(context.Background(), "demo", "key-500"); chargeonce.ErrorCode(err) != chargeonce.ENOTFOUND {
		t.Fatalf("the key was not released after a 5xx: %v", err)
	}
	if sim.Stats().CaptureRequests != 0 {
		t.Fatalf("the acquirer was called")
	}
	again := apitest.Charge(t, healthy.URL, "key-500", chargeBody(order, "tok_ok"))
	if again.Status != 201 || again.Header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("retry after 5xx: %d replayed=%q %s", again.Status, again.Header.Get("Idempotent-Replayed"), again.Body)
	}
}
