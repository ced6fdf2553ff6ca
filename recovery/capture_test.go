package recovery_test

import (
	"bytes"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/idempotency"
	"github.com/chargeonce/chargeonce/recovery"
)

// manualRequest returns a normalised manual charge request for a new order.
func manualRequest(token string) *chargeonce.ChargeRequest {
	r := request(token)
	r.CaptureMethod = chargeonce.CaptureManual
	if err := r.Normalize(); err != nil {
		panic(err)
	}
	return r
}

// TestManualCaptureThroughEngine: a manual charge authorizes only (201,
// status authorized, nothing captured at the acquirer); its capture is
// answered 200 and replayed byte for byte, a key reused for a cancel is
// 422, a second capture and a cancel are refused with nothing kept, and a
// refund is bounded by the captured amount. An automatic charge's answer
// does not name a capture method.
func TestManualCaptureThroughEngine(t *testing.T) {
	t.Parallel()
	e := setup(t, nil, engine.Options{})
	eng := engine.New(e.store, e.sim, e.eng.Options())
	req := manualRequest("tok_ok")
	resp, err := eng.Charge(t.Context(), "demo", "auth", req)
	if err != nil || resp.Status != 201 || !bytes.Contains(resp.Body, []byte(`"status":"authorized"`)) ||
		!bytes.Contains(resp.Body, []byte(`"capture_method":"manual","amount_captured_cents":0`)) {
		t.Fatalf("manual charge: %d %s, %v", resp.Status, resp.Body, err)
	}
	ch := get(t, e.store, "auth").Charge
	if n := e.sim.CapturedCount("demo", req.OrderID); n != 0 {
		t.Fatalf("an authorization captured %d times at the acquirer", n)
	}
	// The same key with the automatic capture method is another request.
	auto := *req
	auto.CaptureMethod = ""
	if _, err := eng.Charge(t.Context(), "demo", "auth", &auto); chargeonce.ErrorCode(err) != chargeonce.EKEYREUSED {
		t.Fatalf("the key of a manual charge reused automatic: %v; want 422", err)
	}

	capt, err := eng.Capture(t.Context(), "demo", ch.ID, "cap", &chargeonce.CaptureBody{AmountCents: 1500})
	if err != nil || capt.Status != 200 || !bytes.Contains(capt.Body, []byte(`"status":"captured"`)) ||
		!bytes.Contains(capt.Body, []byte(`"amount_captured_cents":1500`)) {
		t.Fatalf("capture: %d %s, %v", capt.Status, capt.Body, err)
	}
	again, err := eng.Capture(t.Context(), "demo", ch.ID, "cap", &chargeonce.CaptureBody{AmountCents: 1500})
	if err != nil || !again.Replayed || again.Status != 200 || !bytes.Equal(again.Body, capt.Body) {
		t.Fatalf("the capture's retry: %d %s replayed=%v, %v; want the stored answer", again.Status, again.Body, again.Replayed, err)
	}
	if _, err := eng.Cancel(t.Context(), "demo", ch.ID, "cap"); chargeonce.ErrorCode(err) != chargeonce.EKEYREUSED {
		t.Fatalf("the capture's key reused for a cancel: %v; want 422", err)
	}
	if _, err := eng.Capture(t.Context(), "demo", ch.ID, "cap-2", &chargeonce.CaptureBody{}); chargeonce.ErrorCode(err) != chargeonce.ENOTAUTHORIZED {
		t.Fatalf("a second capture: %v; want ENOTAUTHORIZED", err)
	}
	if _, err := eng.Cancel(t.Context(), "demo", ch.ID, "cancel"); chargeonce.ErrorCode(err) != chargeonce.ENOTAUTHORIZED {
		t.Fatalf("a cancel of a captured charge: %v; want ENOTAUTHORIZED", err)
	}
	for _, key := range []string{"cap-2", "cancel"} {
		if _, err := e.store.KeyGet(t.Context(), "demo", key); chargeonce.ErrorCode(err) != chargeonce.ENOTFOUND {
			t.Fatalf("refused %s kept a record: %v", key, err)
		}
	}
	if captured, voided := e.sim.Authorization(ch.ID); captured != 1500 || voided {
		t.Fatalf("acquirer: captured %d, voided %v; want 1500, false", captured, voided)
	}
	if _, err := eng.Refund(t.Context(), "demo", ch.ID, "refund", &chargeonce.RefundRequest{AmountCents: 2000}); chargeonce.ErrorCode(err) != chargeonce.EREFUNDEXCEEDS ||
		!strings.Contains(chargeonce.ErrorMessage(err), "remaining amount_cents is 1500") {
		t.Fatalf("a refund of 2000 of a capture of 1500: %v", err)
	}
	if _, err := eng.Capture(t.Context(), "demo", ch.ID, "too-much", &chargeonce.CaptureBody{AmountCents: 2501}); chargeonce.ErrorCode(err) == "" {
		t.Fatal("a capture past the authorization was accepted")
	}

	plain, err := eng.Charge(t.Context(), "demo", "plain", request("tok_ok"))
	if err != nil || plain.Status != 201 || bytes.Contains(plain.Body, []byte("capture_method")) || bytes.Contains(plain.Body, []byte("amount_captured")) {
		t.Fatalf("automatic charge: %d %s, %v", plain.Status, plain.Body, err)
	}
}

// TestManualCaptureRacesThroughEngine: 50 captures with different keys
// race one authorization, and captures race cancels on others: exactly
// one operation wins each, at the acquirer too.
func TestManualCaptureRacesThroughEngine(t *testing.T) {
	t.Parallel()
	e := setup(t, nil, engine.Options{})
	eng := engine.New(e.store, e.sim, e.eng.Options())
	for round := range 3 {
		req := manualRequest("tok_ok")
		key := "auth-" + string(rune('a'+round))
		if resp, err := eng.Charge(t.Context(), "demo", key, req); err != nil || resp.Status != 201 {
			t.Fatalf("manual charge: %d %s, %v", resp.Status, resp.Body, err)
		}
		ch := get(t, e.store, key).Charge
		var (
			wg       sync.WaitGroup
			mu       sync.Mutex
			won      []string
			refused  int
			failures []error
		)
		for i := range 50 {
			wg.Go(func() {
				k := key + "-op-" + idempotency.NewToken()
				var resp engine.Response
				var err error
				if round > 0 && i%2 == 1 {
					resp, err = eng.Cancel(t.Context(), "demo", ch.ID, k)
				} else {
					resp, err = eng.Capture(t.Context(), "demo", ch.ID, k, &chargeonce.CaptureBody{})
				}
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil && resp.Status == 200:
					won = append(won, string(resp.Body))
				case chargeonce.ErrorCode(err) == chargeonce.ENOTAUTHORIZED:
					refused++
				default:
					failures = append(failures, err)
				}
			})
		}
		wg.Wait()
		if len(failures) > 0 || len(won) != 1 || refused != 49 {
			t.Fatalf("round %d: %d won, %d refused, failures %v; want 1, 49, none", round, len(won), refused, failures)
		}
		captured, voided := e.sim.Authorization(ch.ID)
		if (captured > 0) == voided {
			t.Fatalf("round %d: acquirer captured %d and voided=%v; want exactly one", round, captured, voided)
		}
	}
}

// TestSweeperCancelsExpiredAuthorizations: an authorization past its TTL
// is voided at the acquirer by the sweeper, under a key of its own (a
// second sweep begins no second cancel), recording charge.canceled once;
// a young one and a captured one are left alone. A cancel whose first
// request is lost (tok_fail_after) is left to recovery, which looks it up
// and settles it without voiding again.
func TestSweeperCancelsExpiredAuthorizations(t *testing.T) {
	t.Parallel()
	e := setup(t, nil, engine.Options{})
	eng := engine.New(e.store, e.sim, e.eng.Options())
	authorize := func(key, token string) chargeonce.Charge {
		t.Helper()
		req := manualRequest(token)
		for deadline := time.Now().Add(10 * time.Second); ; {
			resp, err := eng.Charge(t.Context(), "demo", key, req)
			if err == nil && resp.Status == 201 {
				return get(t, e.store, key).Charge
			}
			if time.Now().After(deadline) || (err != nil && chargeonce.ErrorCode(err) != chargeonce.EINPROGRESS) || (err == nil && resp.Status != 202) {
				t.Fatalf("manual charge %s: %d %s, %v", key, resp.Status, resp.Body, err)
			}
			time.Sleep(50 * time.Millisecond) // a lost answer: the retry looks the authorization up
		}
	}
	old := authorize("old", "tok_ok")
	lost := authorize("lost", "tok_fail_after") // its first request is answered; the void's first is lost
	captured := authorize("captured", "tok_ok")
	if resp, err := eng.Capture(t.Context(), "demo", captured.ID, "cap", &chargeonce.CaptureBody{}); err != nil || resp.Status != 200 {
		t.Fatalf("capture: %d %s, %v", resp.Status, resp.Body, err)
	}
	time.Sleep(300 * time.Millisecond)
	young := authorize("young", "tok_ok")

	s := recovery.NewSweeper(e.store, recovery.SweeperOptions{Canceler: eng, AuthorizationTTL: 250 * time.Millisecond})
	pass, err := s.ExpireOnce(t.Context())
	if err != nil || pass != (recovery.ExpiryPass{Canceled: 1, Pending: 1}) {
		t.Fatalf("ExpireOnce = %+v, %v; want 1 canceled and 1 left to recovery", pass, err)
	}
	if pass, err := s.ExpireOnce(t.Context()); err != nil || pass.Tried() != 0 {
		t.Fatalf("second ExpireOnce = %+v, %v; want none", pass, err)
	}
	status := func(ch chargeonce.Charge) chargeonce.Status {
		t.Helper()
		got, err := e.store.ChargeGet(t.Context(), "demo", ch.ID)
		if err != nil {
			t.Fatal(err)
		}
		return got.Status
	}
	if status(old) != chargeonce.StatusCanceled || status(young) != chargeonce.StatusAuthorized || status(captured) != chargeonce.StatusCaptured {
		t.Fatalf("after the sweep: old %s, young %s, captured %s", status(old), status(young), status(captured))
	}
	if _, voided := e.sim.Authorization(old.ID); !voided {
		t.Fatal("the expired authorization was not voided at the acquirer")
	}
	// The lost void: voided at the acquirer, unknown here, then settled by
	// recovery from the lookup, with no second void.
	if status(lost) != chargeonce.StatusAuthorized {
		t.Fatalf("lost: %s; want authorized until recovery", status(lost))
	}
	rec := get(t, e.store, engine.ExpiryKeyPrefix+lost.ID)
	if rec.State != chargeonce.KeyProcessing || rec.Operation == nil || rec.Kind() != chargeonce.KindCancel {
		t.Fatalf("the lost cancel's record: %+v", rec)
	}
	time.Sleep(e.eng.Backoff(1) + 50*time.Millisecond)
	before := e.sim.Stats()
	res, err := recovery.NewRescuer(e.store, eng, recovery.RescuerOptions{}).RunOnce(t.Context())
	if err != nil || res.Settled != 1 {
		t.Fatalf("recovery: %+v, %v; want the lost cancel settled", res, err)
	}
	if status(lost) != chargeonce.StatusCanceled {
		t.Fatalf("lost after recovery: %s", status(lost))
	}
	if after := e.sim.Stats(); after.Voids != before.Voids || after.OperationRequests != before.OperationRequests {
		t.Fatalf("recovery sent the void again: %+v then %+v", before, after)
	}
	for _, ch := range []chargeonce.Charge{old, lost} {
		page, err := e.store.WebhookEventsList(t.Context(), chargeonce.EventsListParams{MerchantID: "demo", ChargeID: ch.ID, Limit: 10})
		if err != nil || len(page.Events) != 1 || page.Events[0].Type != "charge.canceled" {
			t.Fatalf("events of %s: %+v, %v; want charge.canceled once", ch.ID, page.Events, err)
		}
	}
}
