package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/internal/apitest"
)

var storeKinds = []string{"postgres", "sqlite"}

type fixture struct {
	inst  *apitest.Instance
	sim   *acquirer.Simulator
	store chargeonce.Store
}

func setup(t *testing.T, kind string, opts engine.Options, simOpts acquirer.Options) fixture {
	t.Helper()
	store := apitest.Store(t, kind)
	sim := apitest.Simulator(t, simOpts)
	return fixture{inst: apitest.Start(t, store, sim, opts), sim: sim, store: store}
}

var orderSeq atomic.Int64

func init() { orderSeq.Store(time.Now().UnixNano() % 1e9 * 1000) }

func chargeBody(order int64, token string) string {
	return fmt.Sprintf(`{"order_id": %d, "amount_cents": 25000, "currency": "BRL", "payment_token": %q}`, order, token)
}

type problem struct {
	Type        string `json:"type"`
	Title       string `json:"title"`
	Status      int    `json:"status"`
	Detail      string `json:"detail"`
	Field       string `json:"field"`
	ChargeID    string `json:"charge_id"`
	DeclineCode string `json:"decline_code"`
}

func decodeProblem(t *testing.T, r apitest.Result) problem {
	t.Helper()
	if ct := r.Header.Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type = %q, want application/problem+json; body %s", ct, r.Body)
	}
	var p problem
	if err := json.Unmarshal(r.Body, &p); err != nil {
		t.Fatalf("decoding problem %s: %v", r.Body, err)
	}
	if p.Status != r.Status || p.Title == "" || p.Detail == "" {
		t.Fatalf("problem %+v does not match status %d or lacks title/detail", p, r.Status)
	}
	return p
}

func wantProblem(t *testing.T, r apitest.Result, status int, slug string) problem {
	t.Helper()
	if r.Status != status {
		t.Fatalf("status = %d, want %d; body %s", r.Status, status, r.Body)
	}
	p := decodeProblem(t, r)
	if !strings.HasSuffix(p.Type, "/"+slug) {
		t.Fatalf("problem type = %q, want it to end in %q", p.Type, slug)
	}
	return p
}

type chargeJSON struct {
	ID          string  `json:"id"`
	OrderID     int64   `json:"order_id"`
	AmountCents int64   `json:"amount_cents"`
	Currency    string  `json:"currency"`
	Status      string  `json:"status"`
	DeclineCode *string `json:"decline_code"`
	CreatedAt   string  `json:"created_at"`
	// Only on a manual charge.
	CaptureMethod       string `json:"capture_method"`
	AmountCapturedCents *int64 `json:"amount_captured_cents"`
}

func decodeCharge(t *testing.T, b []byte) chargeJSON {
	t.Helper()
	var c chargeJSON
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		t.Fatalf("decoding charge %s: %v", b, err)
	}
	if _, err := time.Parse(time.RFC3339, c.CreatedAt); err != nil {
		t.Fatalf("created_at %q: %v", c.CreatedAt, err)
	}
	return c
}

func TestCapturedIsStoredAndReplayedByteForByte(t *testing.T) {
	t.Parallel()
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			f := setup(t, kind, engine.Options{}, acquirer.Options{})
			order := orderSeq.Add(1)
			first := apitest.Charge(t, f.inst.URL, "key-captured", chargeBody(order, "tok_ok"))
			if first.Status != 201 {
				t.Fatalf("first attempt: %d %s", first.Status, first.Body)
			}
			if first.Header.Get("Idempotent-Replayed") != "" {
				t.Fatalf("first attempt must not be marked replayed")
			}
			c := decodeCharge(t, first.Body)
			if c.Status != "captured" || c.OrderID != order || c.AmountCents != 25000 || c.Currency != "BRL" || c.DeclineCode != nil || !strings.HasPrefix(c.ID, "ch_") {
				t.Fatalf("unexpected charge %+v", c)
			}
			// The same request with other whitespace and field order, and
			// the currency left to its default, is the same request.
			same := fmt.Sprintf(`{ "payment_token":"tok_ok",
				"amount_cents":25000,   "order_id":%d }`, order)
			for i := 0; i < 3; i++ {
				again := apitest.Charge(t, f.inst.URL, "key-captured", same)
				if again.Status != 201 || !bytes.Equal(again.Body, first.Body) {
					t.Fatalf("replay %d: %d %s, want 201 %s", i, again.Status, again.Body, first.Body)
				}
				if again.Header.Get("Idempotent-Replayed") != "true" {
					t.Fatalf("replay %d lacks Idempotent-Replayed: true", i)
				}
			}
			// A quoted structured-field key is the same key.
			quoted := apitest.Charge(t, f.inst.URL, `"key-captured"`, same)
			if quoted.Status != 201 || !bytes.Equal(quoted.Body, first.Body) {
				t.Fatalf("quoted key replay: %d %s", quoted.Status, quoted.Body)
			}
			if n := f.sim.CapturedCount("demo", order); n != 1 {
				t.Fatalf("acquirer captured %d times, want 1", n)
			}
			if st := f.sim.Stats(); st.CaptureRequests != 1 {
				t.Fatalf("acquirer got %d requests, want 1 (replays must not reach it)", st.CaptureRequests)
			}
			// GET by id and list by order see the captured charge.
			got, err := apitest.Do(t, nil, "GET", f.inst.URL+"/v1/charges/"+c.ID, nil, nil)
			if err != nil || got.Status != 200 || !bytes.Equal(got.Body, first.Body) {
				t.Fatalf("GET charge: %v %d %s", err, got.Status, got.Body)
			}
			list, err := apitest.Do(t, nil, "GET", fmt.Sprintf("%s/v1/charges?order_id=%d", f.inst.URL, order), nil, nil)
			if err != nil || list.Status != 200 {
				t.Fatalf("list: %v %d %s", err, list.Status, list.Body)
			}
			var l struct{ Data []chargeJSON }
			if err := json.Unmarshal(list.Body, &l); err != nil || len(l.Data) != 1 || l.Data[0].ID != c.ID {
				t.Fatalf("list = %s (%v), want exactly %s", list.Body, err, c.ID)
			}
		})
	}
}

func TestDeclinedIsStoredAndReplayed(t *testing.T) {
	t.Parallel()
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			f := setup(t, kind, engine.Options{}, acquirer.Options{})
			order := orderSeq.Add(1)
			first := apitest.Charge(t, f.inst.URL, "key-declined", chargeBody(order, "tok_declined"))
			p := wantProblem(t, first, 402, "card-declined")
			if p.DeclineCode != "insufficient_funds" || !strings.HasPrefix(p.ChargeID, "ch_") {
				t.Fatalf("declined problem %+v lacks charge_id or decline_code", p)
			}
			again := apitest.Charge(t, f.inst.URL, "key-declined", chargeBody(order, "tok_declined"))
			if again.Status != 402 || !bytes.Equal(again.Body, first.Body) || again.Header.Get("Idempotent-Replayed") != "true" {
				t.Fatalf("replay: %d %q %s", again.Status, again.Header.Get("Idempotent-Replayed"), again.Body)
			}
			ch, err := f.store.ChargeGet(context.Background(), "demo", p.ChargeID)
			if err != nil || ch.Status != chargeonce.StatusDeclined || ch.DeclineCode != "insufficient_funds" {
				t.Fatalf("stored charge %+v, %v", ch, err)
			}
			if st := f.sim.Stats(); st.CaptureRequests != 1 {
				t.Fatalf("acquirer got %d requests, want 1", st.CaptureRequests)
			}
		})
	}
}

func TestUnknownOutcomeAnswers202AndIsNotStored(t *testing.T) {
	t.Parallel()
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			const backoff = 400 * time.Millisecond
			f := setup(t, kind, engine.Options{AcquirerTimeout: 100 * time.Millisecond, BackoffBase: backoff}, acquirer.Options{Slow: 400 * time.Millisecond})
			order := orderSeq.Add(1)
			first := apitest.Charge(t, f.inst.URL, "key-unknown", chargeBody(order, "tok_slow"))
			if first.Status != 202 {
				t.Fatalf("status = %d, want 202; %s", first.Status, first.Body)
			}
			c := decodeCharge(t, first.Body)
			if c.Status != "processing" {
				t.Fatalf("status %q, want processing", c.Status)
			}
			rec, err := f.store.KeyGet(context.Background(), "demo", "key-unknown")
			if err != nil || rec.State != chargeonce.KeyProcessing || rec.ResponseBody != nil {
				t.Fatalf("record after 202: %+v, %v; want processing with no stored response", rec, err)
			}
			// The unknown outcome backs the record off as recovery would
			// (counted, base*2^0 jittered) and the 202 says when to come
			// back.
			if rec.RecoveryAttempts != 1 || rec.LeaseExpired || rec.LeaseRemaining > backoff {
				t.Fatalf("after an unknown outcome: attempts %d, lease expired %v, remaining %s; want 1 attempt counted and a back-off of at most %s",
					rec.RecoveryAttempts, rec.LeaseExpired, rec.LeaseRemaining, backoff)
			}
			if ra := first.Header.Get("Retry-After"); ra != "1" {
				t.Fatalf("202 Retry-After %q, want 1 (the %s back-off, rounded up)", ra, backoff)
			}
			// tok_fail_before also answers 202: a 503 from the acquirer is
			// an unknown outcome too.
			fb := apitest.Charge(t, f.inst.URL, "key-fail-before", chargeBody(orderSeq.Add(1), "tok_fail_before"))
			if fb.Status != 202 {
				t.Fatalf("tok_fail_before: %d %s, want 202", fb.Status, fb.Body)
			}
			// Once the slow capture has finished and the back-off is over, a
			// retry takes the record over, re-drives the acquirer with the same reference, and ends
			// with the one capture.
			f.sim.Wait()
			apitest.Eventually(t, 5*time.Second, "the back-off to end", func() bool {
				rec, err := f.store.KeyGet(context.Background(), "demo", "key-unknown")
				return err == nil && rec.LeaseExpired
			})
			final := apitest.Charge(t, f.inst.URL, "key-unknown", chargeBody(order, "tok_slow"))
			if final.Status != 201 {
				t.Fatalf("retry after the capture finished: %d %s", final.Status, final.Body)
			}
			if got := decodeCharge(t, final.Body); got.ID != c.ID || got.Status != "captured" {
				t.Fatalf("retry answered %+v, want charge %s captured", got, c.ID)
			}
			if n := f.sim.CapturedCount("demo", order); n != 1 {
				t.Fatalf("captured %d times, want 1", n)
			}
		})
	}
}

// TestInFlightAnswers409WithoutWaiting is the article's lock-wait trap: while
// the first attempt is at a slow acquirer, a second attempt with the same
// key must get 409 at once, not wait on a row lock held across the call.
func TestInFlightAnswers409WithoutWaiting(t *testing.T) {
	t.Parallel()
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			const slow = 1500 * time.Millisecond
			f := setup(t, kind, engine.Options{AcquirerTimeout: 5 * time.Second}, acquirer.Options{Slow: slow})
			order := orderSeq.Add(1)
			firstDone := make(chan apitest.Result, 1)
			start := time.Now()
			go func() {
				r, _ := apitest.Do(t, nil, "POST", f.inst.URL+"/v1/charges", []byte(chargeBody(order, "tok_slow")), map[string]string{"Idempotency-Key": "key-slow"})
				firstDone <- r
			}()
			// Wait until the first attempt is at the acquirer.
			apitest.Eventually(t, 2*time.Second, "the first attempt to reach the acquirer", func() bool {
				return f.sim.Stats().CaptureRequests == 1
			})
			var worst time.Duration
			for i := 0; i < 5; i++ {
				t0 := time.Now()
				second := apitest.Charge(t, f.inst.URL, "key-slow", chargeBody(order, "tok_slow"))
				lat := time.Since(t0)
				worst = max(worst, lat)
				wantProblem(t, second, 409, "request-in-progress")
				if second.Header.Get("Retry-After") == "" {
					t.Fatalf("409 without Retry-After")
				}
			}
			first := <-firstDone
			firstTook := time.Since(start)
			t.Logf("%s: second attempt's 409 took at most %s while the first attempt took %s at a %s acquirer", kind, worst, firstTook.Round(time.Millisecond), slow)
			if first.Status != 201 {
				t.Fatalf("first attempt: %d %s", first.Status, first.Body)
			}
			if firstTook < slow {
				t.Fatalf("the first attempt finished in %s, before the slow acquirer (%s): the 409s were not measured while it was in flight", firstTook, slow)
			}
			// A retry that waited on the first attempt's lock would take
			// most of the slow capture; one that answers at once takes a
			// round trip, slower on a loaded machine (a connection may be
			// opened for it) but far below the capture.
			if worst >= slow/3 {
				t.Fatalf("a 409 took %s of a %s capture: the retry waited (on a lock?) instead of answering at once", worst, slow)
			}
		})
	}
}

func TestKeyReusedForDifferentRequestIs422(t *testing.T) {
	t.Parallel()
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			f := setup(t, kind, engine.Options{}, acquirer.Options{})
			order := orderSeq.Add(1)
			first := apitest.Charge(t, f.inst.URL, "key-reuse", chargeBody(order, "tok_ok"))
			if first.Status != 201 {
				t.Fatalf("first: %d %s", first.Status, first.Body)
			}
			for _, body := range []string{
				fmt.Sprintf(`{"order_id": %d, "amount_cents": 25001, "payment_token": "tok_ok"}`, order),
				fmt.Sprintf(`{"order_id": %d, "amount_cents": 25000, "payment_token": "tok_ok", "currency": "USD"}`, order),
				fmt.Sprintf(`{"order_id": %d, "amount_cents": 25000, "payment_token": "tok_ok", "description": "x"}`, order),
				chargeBody(order+1, "tok_ok"),
			} {
				r := apitest.Charge(t, f.inst.URL, "key-reuse", body)
				wantProblem(t, r, 422, "idempotency-key-reused")
			}
			// The stored answer is untouched.
			again := apitest.Charge(t, f.inst.URL, "key-reuse", chargeBody(order, "tok_ok"))
			if again.Status != 201 || !bytes.Equal(again.Body, first.Body) {
				t.Fatalf("replay after 422s: %d %s", again.Status, again.Body)
			}
			if f.sim.Stats().CaptureRequests != 1 {
				t.Fatalf("a 422 reached the acquirer")
			}
		})
	}
}

func TestMerchantScope(t *testing.T) {
	t.Parallel()
	f := setup(t, "postgres", engine.Options{}, acquirer.Options{})
	order := orderSeq.Add(1)
	demo := apitest.Charge(t, f.inst.URL, "shared-key", chargeBody(order, "tok_ok"))
	other, err := apitest.Do(t, nil, "POST", f.inst.URL+"/v1/charges", []byte(chargeBody(order, "tok_ok")),
		map[string]string{"Idempotency-Key": "shared-key", "Authorization": "Bearer " + apitest.OtherAPIKey})
	if err != nil || demo.Status != 201 || other.Status != 201 {
		t.Fatalf("demo %d, other %d (%v)", demo.Status, other.Status, err)
	}
	if other.Header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("another merchant's key must be a new intent, not a replay")
	}
	dc, oc := decodeCharge(t, demo.Body), decodeCharge(t, other.Body)
	if dc.ID == oc.ID {
		t.Fatalf("two merchants share charge %s", dc.ID)
	}
	// No merchant sees another's charge.
	r, err := apitest.Do(t, nil, "GET", f.inst.URL+"/v1/charges/"+oc.ID, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	wantProblem(t, r, 404, "not-found")
	list, err := apitest.Do(t, nil, "GET", fmt.Sprintf("%s/v1/charges?order_id=%d", f.inst.URL, order), nil, nil)
	if err != nil || strings.Contains(string(list.Body), oc.ID) || !strings.Contains(string(list.Body), dc.ID) {
		t.Fatalf("list leaks across merchants or misses own charge: %s", list.Body)
	}
}
