package httpapi_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/internal/apitest"
)

type refundJSON struct {
	ID            string  `json:"id"`
	ChargeID      string  `json:"charge_id"`
	AmountCents   int64   `json:"amount_cents"`
	Currency      string  `json:"currency"`
	Status        string  `json:"status"`
	Reason        *string `json:"reason"`
	FailureReason *string `json:"failure_reason"`
	CreatedAt     string  `json:"created_at"`
	Metadata      map[string]string
}

func decodeRefund(t *testing.T, b []byte) refundJSON {
	t.Helper()
	var r refundJSON
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		t.Fatalf("decoding refund %s: %v", b, err)
	}
	if _, err := time.Parse(time.RFC3339, r.CreatedAt); err != nil {
		t.Fatalf("created_at %q: %v", r.CreatedAt, err)
	}
	return r
}

func refund(t *testing.T, f fixture, chargeID, key, body string) apitest.Result {
	t.Helper()
	r, err := apitest.Do(t, nil, "POST", f.inst.URL+"/v1/charges/"+chargeID+"/refunds", []byte(body), map[string]string{"Idempotency-Key": key})
	if err != nil {
		t.Fatalf("POST refund: %v", err)
	}
	return r
}

// capture charges amount with token until the charge is captured.
func capture(t *testing.T, f fixture, amount int64, token string) chargeJSON {
	t.Helper()
	key := fmt.Sprintf("charge-%d", orderSeq.Add(1))
	body := fmt.Sprintf(`{"order_id": %d, "amount_cents": %d, "payment_token": %q}`, orderSeq.Add(1), amount, token)
	var c chargeJSON
	apitest.Eventually(t, 10*time.Second, "the charge captured", func() bool {
		r := apitest.Charge(t, f.inst.URL, key, body)
		if r.Status == 201 {
			c = decodeCharge(t, r.Body)
		}
		return r.Status == 201
	})
	return c
}

func TestRefundsFollowTheChargeProtocol(t *testing.T) {
	t.Parallel()
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			f := setup(t, kind, engine.Options{}, acquirer.Options{})
			c := capture(t, f, 25000, "tok_ok")

			first := refund(t, f, c.ID, "refund-1", `{"amount_cents": 10000, "reason": "requested_by_customer", "metadata": {"ticket": "T-1"}}`)
			if first.Status != 201 || first.Header.Get("Idempotent-Replayed") != "" {
				t.Fatalf("first refund: %d %s (replayed %q)", first.Status, first.Body, first.Header.Get("Idempotent-Replayed"))
			}
			r := decodeRefund(t, first.Body)
			if !strings.HasPrefix(r.ID, "re_") || r.ChargeID != c.ID || r.AmountCents != 10000 || r.Currency != "BRL" ||
				r.Status != "succeeded" || r.Reason == nil || *r.Reason != "requested_by_customer" || r.Metadata["ticket"] != "T-1" {
				t.Fatalf("first refund: %+v", r)
			}
			// The same request, other whitespace and order: the stored answer.
			again := refund(t, f, c.ID, "refund-1", `{"metadata":{"ticket":"T-1"},"reason":"requested_by_customer","amount_cents":10000}`)
			if again.Status != 201 || !bytes.Equal(again.Body, first.Body) || again.Header.Get("Idempotent-Replayed") != "true" {
				t.Fatalf("replay: %d %s (replayed %q); want 201 %s", again.Status, again.Body, again.Header.Get("Idempotent-Replayed"), first.Body)
			}
			wantProblem(t, refund(t, f, c.ID, "refund-1", `{"amount_cents": 10001}`), 422, "idempotency-key-reused")
			over := wantProblem(t, refund(t, f, c.ID, "refund-2", `{"amount_cents": 20000}`), 400, "refund-exceeds-captured")
			if !strings.Contains(over.Detail, "remaining amount_cents is 15000") {
				t.Fatalf("refusal %q does not name the remaining 15000", over.Detail)
			}
			// Refused, nothing kept: the same key may refund less.
			rest := refund(t, f, c.ID, "refund-2", ``)
			if rest.Status != 201 {
				t.Fatalf("refund of the rest: %d %s", rest.Status, rest.Body)
			}
			if r2 := decodeRefund(t, rest.Body); r2.AmountCents != 15000 || r2.Status != "succeeded" || r2.Reason != nil {
				t.Fatalf("refund of the rest: %+v; want 15000 succeeded", r2)
			}
			wantProblem(t, refund(t, f, c.ID, "refund-3", `{"amount_cents": 1}`), 400, "refund-exceeds-captured")
			if got := f.sim.RefundedCents(c.ID); got != 25000 {
				t.Fatalf("the acquirer refunded %d of the charge; want 25000", got)
			}
			if st := f.sim.Stats(); st.RefundRequests != 2 || st.Refunds != 2 {
				t.Fatalf("acquirer stats %+v; want 2 refund requests, 2 refunds (replays and refusals never reach it)", st)
			}

			got, err := apitest.Do(t, nil, "GET", f.inst.URL+"/v1/refunds/"+r.ID, nil, nil)
			if err != nil || got.Status != 200 || !bytes.Equal(got.Body, first.Body) {
				t.Fatalf("GET refund: %v %d %s; want %s", err, got.Status, got.Body, first.Body)
			}
			list, err := apitest.Do(t, nil, "GET", f.inst.URL+"/v1/refunds?limit=1&charge_id="+c.ID, nil, nil)
			if err != nil || list.Status != 200 {
				t.Fatalf("list: %v %d %s", err, list.Status, list.Body)
			}
			var l struct {
				Data    []refundJSON
				HasMore bool `json:"has_more"`
			}
			if err := json.Unmarshal(list.Body, &l); err != nil || len(l.Data) != 1 || !l.HasMore || l.Data[0].AmountCents != 15000 {
				t.Fatalf("list = %s (%v); want the newest refund and has_more", list.Body, err)
			}
			next, err := apitest.Do(t, nil, "GET", f.inst.URL+"/v1/refunds?charge_id="+c.ID+"&starting_after="+l.Data[0].ID, nil, nil)
			if err != nil || next.Status != 200 || !strings.Contains(string(next.Body), r.ID) || !strings.Contains(string(next.Body), `"has_more":false`) {
				t.Fatalf("next page: %v %d %s; want %s", err, next.Status, next.Body, r.ID)
			}
			wantProblem(t, mustDo(t, "GET", f.inst.URL+"/v1/refunds?chargeid="+c.ID), 400, "validation-failed")
			wantProblem(t, mustDo(t, "GET", f.inst.URL+"/v1/refunds/re_nope"), 404, "not-found")
		})
	}
}

func mustDo(t *testing.T, method, url string) apitest.Result {
	t.Helper()
	r, err := apitest.Do(t, nil, method, url, nil, nil)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	return r
}

func TestRefundRefusals(t *testing.T) {
	t.Parallel()
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			f := setup(t, kind, engine.Options{}, acquirer.Options{})
			declined := apitest.Charge(t, f.inst.URL, "declined", chargeBody(orderSeq.Add(1), "tok_declined"))
			p := wantProblem(t, declined, 402, "card-declined")
			wantProblem(t, refund(t, f, p.ChargeID, "refund-declined", `{}`), 400, "charge-not-refundable")
			wantProblem(t, refund(t, f, "ch_nope", "refund-nothing", `{}`), 404, "not-found")
			c := capture(t, f, 100, "tok_ok")
			r, err := apitest.Do(t, nil, "POST", f.inst.URL+"/v1/charges/"+c.ID+"/refunds", []byte(`{}`), nil)
			if err != nil {
				t.Fatal(err)
			}
			wantProblem(t, r, 400, "missing-idempotency-key")
			wantProblem(t, refund(t, f, c.ID, "bad-amount", `{"amount_cents": -5}`), 400, "validation-failed")
			wantProblem(t, refund(t, f, c.ID, "bad-field", `{"amount": 5}`), 400, "validation-failed")
			wantProblem(t, refund(t, f, c.ID, "dup-field", `{"amount_cents": 1, "amount_cents": 99}`), 400, "validation-failed")
			// A charge's key sent to refund is another request: 422.
			wantProblem(t, refund(t, f, c.ID, "declined", `{}`), 422, "idempotency-key-reused")
			wantProblem(t, mustDo(t, "DELETE", f.inst.URL+"/v1/charges/"+c.ID+"/refunds"), 405, "method-not-allowed")
			if st := f.sim.Stats(); st.RefundRequests != 0 {
				t.Fatalf("refused refunds reached the acquirer: %+v", st)
			}
		})
	}
}

// TestRefundRaceOverHTTP: 50 concurrent refunds of 60 on a charge of 100,
// each with its own key: one 201, 49 answers 400 naming the remaining 40,
// and the acquirer refunds 60 once.
func TestRefundRaceOverHTTP(t *testing.T) {
	t.Parallel()
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			f := setup(t, kind, engine.Options{}, acquirer.Options{})
			c := capture(t, f, 100, "tok_ok")
			const n = 50
			var (
				wg       sync.WaitGroup
				mu       sync.Mutex
				statuses = map[int]int{}
				details  []string
			)
			for i := range n {
				wg.Go(func() {
					r := refund(t, f, c.ID, fmt.Sprintf("race-%d", i), `{"amount_cents": 60}`)
					mu.Lock()
					defer mu.Unlock()
					statuses[r.Status]++
					if r.Status == 400 {
						details = append(details, string(r.Body))
					}
				})
			}
			wg.Wait()
			if statuses[201] != 1 || statuses[400] != n-1 {
				t.Fatalf("answers %v; want one 201 and %d 400", statuses, n-1)
			}
			for _, d := range details {
				if !strings.Contains(d, "remaining amount_cents is 40") || !strings.Contains(d, "refund-exceeds-captured") {
					t.Fatalf("refusal %s does not name the remaining 40", d)
				}
			}
			if got := f.sim.RefundedCents(c.ID); got != 60 {
				t.Fatalf("acquirer refunded %d; want 60", got)
			}
		})
	}
}

// TestRefundUnknownOutcomeLookedUpBeforeResend: a charge paid with
// tok_fail_after makes its refund's first request settle at the acquirer
// and lose the reply: the attempt answers 202 pending, and the retry after
// the back-off claims the record, looks the reference up, finds the refund
// and stores it without sending it again.
func TestRefundUnknownOutcomeLookedUpBeforeResend(t *testing.T) {
	t.Parallel()
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			f := setup(t, kind, engine.Options{BackoffBase: 20 * time.Millisecond, BackoffMax: 50 * time.Millisecond}, acquirer.Options{})
			c := capture(t, f, 5000, "tok_fail_after")
			first := refund(t, f, c.ID, "lost-reply", `{"amount_cents": 3000}`)
			if first.Status != 202 || first.Header.Get("Retry-After") == "" {
				t.Fatalf("first refund: %d %s; want 202 with Retry-After", first.Status, first.Body)
			}
			if r := decodeRefund(t, first.Body); r.Status != "pending" {
				t.Fatalf("first refund: %+v; want pending", r)
			}
			var final apitest.Result
			apitest.Eventually(t, 10*time.Second, "the refund settled", func() bool {
				final = refund(t, f, c.ID, "lost-reply", `{"amount_cents": 3000}`)
				return final.Status == 201
			})
			if r := decodeRefund(t, final.Body); r.Status != "succeeded" || r.AmountCents != 3000 {
				t.Fatalf("settled refund: %+v", r)
			}
			if st := f.sim.Stats(); st.RefundRequests != 1 || st.Refunds != 1 {
				t.Fatalf("acquirer stats %+v; want the refund sent once (the retry looked it up)", st)
			}
		})
	}
}

// exerciseRefunds makes every documented answer of the refund routes that
// can be made on a healthy instance, through the OpenAPI conformance
// checker (TestOpenAPIConformance).
func exerciseRefunds(t *testing.T, c *conformance, base string, key func(string) string) {
	t.Helper()
	want := func(r apitest.Result, status int, what string) {
		t.Helper()
		if r.Status != status {
			t.Errorf("%s: status %d, want %d; body %s", what, r.Status, status, r.Body)
		}
	}
	const route = "/v1/charges/{id}/refunds"
	post := func(chargeID, k, body string, headers map[string]string, valid bool) apitest.Result {
		h := map[string]string{"Idempotency-Key": k}
		for name, v := range headers {
			h[name] = v
		}
		var b []byte
		if body != "" {
			b = []byte(body)
		}
		return c.exchange(base, "POST", route, "/v1/charges/"+chargeID+"/refunds", b, h, valid)
	}
	charge := func(token string, status int) string {
		t.Helper()
		k, body := key("refunded"), []byte(chargeBody(orderSeq.Add(1), token))
		r := c.exchange(base, "POST", "/v1/charges", "/v1/charges", body, map[string]string{"Idempotency-Key": k}, true)
		want(r, status, "a charge to refund")
		if status == 202 {
			apitest.Eventually(t, 10*time.Second, "the lost reply's charge captured", func() bool {
				r = c.exchange(base, "POST", "/v1/charges", "/v1/charges", body, map[string]string{"Idempotency-Key": k}, true)
				return r.Status == 201
			})
		}
		var ch struct {
			ID       string `json:"id"`
			ChargeID string `json:"charge_id"`
		}
		_ = json.Unmarshal(r.Body, &ch)
		return ch.ID + ch.ChargeID
	}
	ok := charge("tok_ok", 201)
	rk := key("refund")
	want(post(ok, rk, `{"amount_cents": 1000, "reason": "requested_by_customer"}`, nil, true), 201, "a refund")
	want(post(ok, rk, `{"amount_cents": 1000, "reason": "requested_by_customer"}`, nil, true), 201, "its replay")
	want(post(ok, rk, `{"amount_cents": 1001}`, nil, true), 422, "the refund's key, another body")
	want(post(ok, key("too-much"), `{"amount_cents": 999999}`, nil, true), 400, "more than remains")
	want(post(ok, key("bad"), `{"amount_cents": "1"}`, nil, false), 400, "a wrong type")
	want(post(ok, "", `{}`, nil, false), 400, "no Idempotency-Key")
	want(post(ok, key("auth"), `{}`, map[string]string{"Authorization": ""}, false), 401, "no API key")
	want(post("ch_nope", key("nope"), `{}`, nil, true), 404, "no such charge")
	declined := charge("tok_declined", 402)
	want(post(declined, key("declined"), `{}`, nil, true), 400, "a declined charge")
	lost := charge("tok_fail_after", 202)
	want(post(lost, key("pending"), `{}`, nil, true), 202, "a refund whose reply is lost")
	want(c.exchange(base, "DELETE", route, "/v1/charges/"+ok+"/refunds", nil, nil, false), 405, "DELETE refunds")

	list := c.exchange(base, "GET", "/v1/refunds", "/v1/refunds?limit=1&charge_id="+ok, nil, nil, true)
	want(list, 200, "list refunds")
	var page struct {
		Data []struct {
			ID string `json:"id"`
		}
	}
	if err := json.Unmarshal(list.Body, &page); err != nil || len(page.Data) != 1 {
		t.Fatalf("refunds of %s: %s (%v)", ok, list.Body, err)
	}
	want(c.exchange(base, "GET", "/v1/refunds", "/v1/refunds?starting_after="+page.Data[0].ID, nil, nil, true), 200, "the next page")
	want(c.exchange(base, "GET", "/v1/refunds", "/v1/refunds?limit=0", nil, nil, false), 400, "limit 0")
	want(c.exchange(base, "GET", "/v1/refunds", "/v1/refunds", nil, map[string]string{"Authorization": ""}, false), 401, "list without a key")
	want(c.exchange(base, "GET", "/v1/refunds/{id}", "/v1/refunds/"+page.Data[0].ID, nil, nil, true), 200, "get a refund")
	want(c.exchange(base, "GET", "/v1/refunds/{id}", "/v1/refunds/re_nope", nil, nil, true), 404, "no such refund")
	want(c.exchange(base, "GET", "/v1/refunds/{id}", "/v1/refunds/"+page.Data[0].ID, nil, map[string]string{"Authorization": ""}, false), 401, "get without a key")
}

// TestRefundEventsCarryTheRefund: a refund's events show the refund as
// data.object (refund.created, refund.updated), charge.refunded the charge,
// in GET /v1/events as in what the sender delivers (webhook.EventObject).
func TestRefundEventsCarryTheRefund(t *testing.T) {
	t.Parallel()
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			f := setup(t, kind, engine.Options{}, acquirer.Options{})
			c := capture(t, f, 25000, "tok_ok")
			r := refund(t, f, c.ID, "refund-events", `{"amount_cents": 1000}`)
			if r.Status != 201 {
				t.Fatalf("refund: %d %s", r.Status, r.Body)
			}
			rf := decodeRefund(t, r.Body)
			got, err := apitest.Do(t, nil, "GET", f.inst.URL+"/v1/events?charge_id="+c.ID, nil, nil)
			if err != nil || got.Status != 200 {
				t.Fatalf("GET events: %v %d %s", err, got.Status, got.Body)
			}
			var page struct {
				Data []struct {
					Type string `json:"type"`
					Data struct {
						Object struct {
							ID string `json:"id"`
						} `json:"object"`
					} `json:"data"`
				} `json:"data"`
			}
			if err := json.Unmarshal(got.Body, &page); err != nil {
				t.Fatal(err)
			}
			seen := map[string]string{}
			for _, ev := range page.Data {
				seen[ev.Type] = ev.Data.Object.ID
			}
			want := map[string]string{"charge.captured": c.ID, "refund.created": rf.ID, "refund.updated": rf.ID, "charge.refunded": c.ID}
			for typ, id := range want {
				if seen[typ] != id {
					t.Errorf("%s carries object %q, want %q (events: %v)", typ, seen[typ], id, seen)
				}
			}
		})
	}
}
