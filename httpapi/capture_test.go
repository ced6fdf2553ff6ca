package httpapi_test

import (
	"bytes"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/internal/apitest"
)

// authorize creates a manual charge of amount with token and retries it
// until it is authorized.
func authorize(t *testing.T, base string, amount int64, token string) chargeJSON {
	t.Helper()
	key := fmt.Sprintf("auth-%d", orderSeq.Add(1))
	body := fmt.Sprintf(`{"order_id": %d, "amount_cents": %d, "payment_token": %q, "capture_method": "manual"}`, orderSeq.Add(1), amount, token)
	var c chargeJSON
	apitest.Eventually(t, 10*time.Second, "the charge authorized", func() bool {
		r := apitest.Charge(t, base, key, body)
		if r.Status == 201 {
			c = decodeCharge(t, r.Body)
		}
		return r.Status == 201
	})
	if c.Status != "authorized" || c.CaptureMethod != "manual" || c.AmountCapturedCents == nil || *c.AmountCapturedCents != 0 {
		t.Fatalf("manual charge: %+v", c)
	}
	return c
}

func operate(t *testing.T, base, chargeID, verb, key, body string) apitest.Result {
	t.Helper()
	var b []byte
	if body != "" {
		b = []byte(body)
	}
	r, err := apitest.Do(t, nil, "POST", base+"/v1/charges/"+chargeID+"/"+verb, b, map[string]string{"Idempotency-Key": key})
	if err != nil {
		t.Fatalf("POST %s: %v", verb, err)
	}
	return r
}

// TestCaptureFollowsTheChargeProtocol: a manual charge is authorized, its
// capture of part of it answers 200 and is replayed byte for byte, the
// key reused for another body is 422, a second capture and a cancel are
// refused 400 charge-not-authorized, a capture past the authorization 400
// capture-exceeds-authorized, GET shows the captured charge, a refund is
// bounded by the captured amount, and an automatic charge cannot be
// captured; a cancel of another authorization answers 200 canceled.
func TestCaptureFollowsTheChargeProtocol(t *testing.T) {
	t.Parallel()
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			f := setup(t, kind, engine.Options{}, acquirer.Options{})
			base := f.inst.URL
			a := authorize(t, base, 25000, "tok_ok")
			if r := operate(t, base, a.ID, "capture", "over", `{"amount_cents": 25001}`); r.Status != 400 || !bytes.Contains(r.Body, []byte("capture-exceeds-authorized")) {
				t.Fatalf("capture past the authorization: %d %s", r.Status, r.Body)
			}
			first := operate(t, base, a.ID, "capture", "cap", `{"amount_cents": 20000}`)
			if first.Status != 200 {
				t.Fatalf("capture: %d %s", first.Status, first.Body)
			}
			c := decodeCharge(t, first.Body)
			if c.Status != "captured" || *c.AmountCapturedCents != 20000 || c.AmountCents != 25000 {
				t.Fatalf("captured charge: %+v", c)
			}
			again := operate(t, base, a.ID, "capture", "cap", `{ "amount_cents" : 20000 }`)
			if again.Status != 200 || !bytes.Equal(again.Body, first.Body) || again.Header.Get("Idempotent-Replayed") != "true" {
				t.Fatalf("the capture's retry: %d %s (replayed %q); want the stored answer", again.Status, again.Body, again.Header.Get("Idempotent-Replayed"))
			}
			if r := operate(t, base, a.ID, "capture", "cap", `{"amount_cents": 100}`); r.Status != 422 {
				t.Fatalf("the capture's key, another amount: %d %s", r.Status, r.Body)
			}
			for _, verb := range []string{"capture", "cancel"} {
				if r := operate(t, base, a.ID, verb, "late-"+verb, ""); r.Status != 400 || !bytes.Contains(r.Body, []byte("charge-not-authorized")) {
					t.Fatalf("%s of a captured charge: %d %s", verb, r.Status, r.Body)
				}
			}
			got, err := apitest.Do(t, nil, "GET", base+"/v1/charges/"+a.ID, nil, nil)
			if err != nil || got.Status != 200 || !bytes.Equal(got.Body, first.Body) {
				t.Fatalf("GET the captured charge: %d %s, %v; want %s", got.Status, got.Body, err, first.Body)
			}
			if r := refund(t, f, a.ID, "too-much", `{"amount_cents": 20001}`); r.Status != 400 || !bytes.Contains(r.Body, []byte("remaining amount_cents is 20000")) {
				t.Fatalf("refund past the captured amount: %d %s", r.Status, r.Body)
			}
			auto := capture(t, f, 1000, "tok_ok")
			if auto.CaptureMethod != "" || auto.AmountCapturedCents != nil {
				t.Fatalf("an automatic charge names a capture method: %+v", auto)
			}
			if r := operate(t, base, auto.ID, "capture", "auto", ""); r.Status != 400 || !bytes.Contains(r.Body, []byte("charge-not-authorized")) {
				t.Fatalf("capture of an automatic charge: %d %s", r.Status, r.Body)
			}
			b := authorize(t, base, 5000, "tok_ok")
			if r := operate(t, base, b.ID, "cancel", "cnl", "{}"); r.Status != 200 || decodeCharge(t, r.Body).Status != "canceled" {
				t.Fatalf("cancel: %d %s", r.Status, r.Body)
			}
			if captured, voided := f.sim.Authorization(b.ID); captured != 0 || !voided {
				t.Fatalf("acquirer after the cancel: captured %d, voided %v", captured, voided)
			}
		})
	}
}

// TestCaptureRacesOverHTTP: 50 concurrent captures of one authorization
// with different keys, and captures racing cancels of another, over HTTP:
// exactly one 200 each, the others 400 charge-not-authorized, and the
// acquirer captured or voided once.
func TestCaptureRacesOverHTTP(t *testing.T) {
	t.Parallel()
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			f := setup(t, kind, engine.Options{}, acquirer.Options{})
			base := f.inst.URL
			for round, verbs := range [][]string{{"capture"}, {"capture", "cancel"}} {
				a := authorize(t, base, 25000, "tok_ok")
				var (
					wg     sync.WaitGroup
					mu     sync.Mutex
					counts = map[int]int{}
				)
				for i := range 50 {
					wg.Go(func() {
						r := operate(t, base, a.ID, verbs[i%len(verbs)], fmt.Sprintf("race-%d-%d", round, i), "")
						mu.Lock()
						defer mu.Unlock()
						counts[r.Status]++
						if r.Status != 200 && !bytes.Contains(r.Body, []byte("charge-not-authorized")) {
							t.Errorf("race answer %d %s", r.Status, r.Body)
						}
					})
				}
				wg.Wait()
				if counts[200] != 1 || counts[400] != 49 {
					t.Fatalf("round %d: answers %v; want one 200 and 49 400", round, counts)
				}
				captured, voided := f.sim.Authorization(a.ID)
				if (captured > 0) == voided {
					t.Fatalf("round %d: acquirer captured %d, voided %v; want exactly one", round, captured, voided)
				}
			}
		})
	}
}

// exerciseCapture provokes every documented answer of the capture and
// cancel routes for the OpenAPI conformance test.
func exerciseCapture(t *testing.T, c *conformance, base string, key func(string) string) {
	t.Helper()
	want := func(r apitest.Result, status int, what string) {
		t.Helper()
		if r.Status != status {
			t.Errorf("%s: status %d, want %d; body %s", what, r.Status, status, r.Body)
		}
	}
	post := func(verb, chargeID, k, body string, headers map[string]string, valid bool) apitest.Result {
		h := map[string]string{"Idempotency-Key": k}
		for name, v := range headers {
			h[name] = v
		}
		var b []byte
		if body != "" {
			b = []byte(body)
		}
		return c.exchange(base, "POST", "/v1/charges/{id}/"+verb, "/v1/charges/"+chargeID+"/"+verb, b, h, valid)
	}
	manual := func(token string) string {
		t.Helper()
		k := key("manual")
		body := []byte(fmt.Sprintf(`{"order_id": %d, "amount_cents": 25000, "payment_token": %q, "capture_method": "manual"}`, orderSeq.Add(1), token))
		var id string
		apitest.Eventually(t, 10*time.Second, "the charge authorized", func() bool {
			r := c.exchange(base, "POST", "/v1/charges", "/v1/charges", body, map[string]string{"Idempotency-Key": k}, true)
			if r.Status == 201 {
				id = decodeCharge(t, r.Body).ID
			}
			return r.Status == 201
		})
		return id
	}
	capKey := ""
	for _, verb := range []string{"capture", "cancel"} {
		body := ""
		if verb == "capture" {
			body = `{"amount_cents": 1000}`
		}
		ok := manual("tok_ok")
		k := key(verb)
		want(post(verb, ok, k, body, nil, true), 200, verb)
		want(post(verb, ok, k, body, nil, true), 200, verb+"'s replay")
		if verb == "capture" {
			capKey = k
			want(post(verb, ok, k, `{"amount_cents": 1001}`, nil, true), 422, "the capture's key, another body")
		} else {
			want(post(verb, ok, capKey, "", nil, true), 422, "a capture's key sent to cancel")
		}
		want(post(verb, ok, key("again"), "", nil, true), 400, verb+" of a settled charge")
		want(post(verb, ok, "", "", nil, false), 400, verb+" without an Idempotency-Key")
		want(post(verb, ok, key("auth"), "", map[string]string{"Authorization": ""}, false), 401, verb+" without an API key")
		want(post(verb, "ch_nope", key("nope"), "", nil, true), 404, verb+" of no such charge")
		want(c.exchange(base, "GET", "/v1/charges/{id}/"+verb, "/v1/charges/"+ok+"/"+verb, nil, nil, false), 405, "GET "+verb)
		// A lost reply: the operation's first request settles at the
		// acquirer and its answer is lost (the authorization's token).
		lost := manual("tok_fail_after")
		want(post(verb, lost, key("lost"), "", nil, true), 202, verb+" whose reply is lost")
		// In flight: the first request of an operation of a tok_slow
		// authorization takes --slow; a retry meanwhile is 409.
		slow := manual("tok_slow")
		sk := key("slow")
		done := make(chan apitest.Result, 1)
		go func() { done <- post(verb, slow, sk, "", nil, true) }()
		time.Sleep(300 * time.Millisecond)
		want(post(verb, slow, sk, "", nil, true), 409, verb+" retried while at the acquirer")
		want(<-done, 200, "the slow "+verb)
	}
	over := manual("tok_ok")
	want(post("capture", over, key("over"), `{"amount_cents": 25001}`, nil, true), 400, "capture past the authorization")
	want(post("capture", over, key("bad"), `{"amount_cents": "1"}`, nil, false), 400, "capture with a wrong type")
}
