package recovery_test

import (
	"fmt"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/acquirer/stripe"
	"github.com/chargeonce/chargeonce/acquirer/stripetest"
	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/recovery"
)

// TestRecoveryAgainstStripeFake is the money-safety storm against the fake
// Stripe, with its windows shrunk to fractions of a second: intents whose
// answers were lost after the PaymentIntent was committed (pm_fail_after),
// intents that failed before anything was created (pm_fail_before), and
// attempts that died mid-call (orphans whose PaymentIntent was created, or
// not), all recovered only after Stripe forgot their idempotency keys.
// Recovery must settle every one from a search or a single send: one
// PaymentIntent per intent, never two.
func TestRecoveryAgainstStripeFake(t *testing.T) {
	t.Parallel()
	const (
		keyTTL    = 400 * time.Millisecond // the fake forgets keys
		window    = 300 * time.Millisecond // the adapter trusts keys this long
		fakeLag   = 100 * time.Millisecond // the fake's search index lags
		searchLag = 250 * time.Millisecond // the adapter's allowance for it
		perKind   = 8
	)
	fake := stripetest.New(stripetest.Options{Key: "sk_test_storm", KeyTTL: keyTTL, SearchLag: fakeLag})
	srv := httptest.NewServer(fake)
	t.Cleanup(srv.Close)
	noRetries := int64(0)
	acq, err := stripe.New(stripe.Options{Key: "sk_test_storm", APIBase: srv.URL, KeyWindow: window, SearchLag: searchLag, MaxNetworkRetries: &noRetries})
	if err != nil {
		t.Fatal(err)
	}
	fast := engine.Options{BackoffBase: 50 * time.Millisecond, BackoffMax: 100 * time.Millisecond}
	e := setup(t, nil, fast)
	eng := engine.New(e.store, acq, e.eng.Options())
	ctx := t.Context()

	type intent struct {
		key  string
		req  *chargeonce.ChargeRequest
		want chargeonce.Status
	}
	var intents []intent
	for i := range perKind {
		for _, pm := range []string{stripetest.PMFailAfter, stripetest.PMFailBefore} {
			in := intent{key: fmt.Sprintf("%s-%d", pm, i), req: request(pm), want: chargeonce.StatusCaptured}
			if resp, err := eng.Charge(ctx, "demo", in.key, in.req); err != nil || resp.Status != 202 {
				t.Fatalf("%s: %d %s, %v; want 202 (outcome unknown)", in.key, resp.Status, resp.Body, err)
			}
			intents = append(intents, in)
		}
		// Attempts that died mid-call: the record is committed and its
		// lease over; half of them had reached Stripe.
		for _, sent := range []bool{true, false} {
			in := intent{key: fmt.Sprintf("killed-%v-%d", sent, i), req: request(stripetest.PMOK), want: chargeonce.StatusCaptured}
			rec := orphan(t, e.store, in.key, in.req)
			if sent {
				ch := rec.Charge
				if _, err := acq.Capture(ctx, chargeonce.CaptureRequest{Reference: ch.ID, OrderID: ch.OrderID, Merchant: ch.MerchantID,
					AmountCents: ch.AmountCents, Currency: ch.Currency, PaymentToken: ch.PaymentToken}); err != nil {
					t.Fatalf("the killed attempt's call: %v", err)
				}
			}
			intents = append(intents, in)
		}
	}
	time.Sleep(keyTTL + 100*time.Millisecond) // Stripe forgets every key before recovery runs

	r := recovery.NewRescuer(e.store, eng, recovery.RescuerOptions{BackoffBase: 50 * time.Millisecond, BackoffMax: 100 * time.Millisecond})
	start := time.Now()
	var passes, deferred int
	for pending := len(intents); pending > 0; {
		if time.Since(start) > 60*time.Second {
			t.Fatalf("%d intents still processing after 60s", pending)
		}
		res, err := r.RunOnce(ctx)
		if err != nil {
			t.Fatal(err)
		}
		passes++
		deferred += res.Deferred
		pending = 0
		for _, in := range intents {
			if get(t, e.store, in.key).State == chargeonce.KeyProcessing {
				pending++
			}
		}
		time.Sleep(60 * time.Millisecond)
	}
	for _, in := range intents {
		wantReplay(t, &env{store: e.store, eng: eng}, in.key, in.req, 201)
	}
	pis := fake.Intents()
	succeeded := fake.Succeeded()
	dups := fake.Duplicates()
	t.Logf("intents %d, PaymentIntents created %d, references captured %d, duplicates %d; %d recovery passes (%d deferrals) in %s",
		len(intents), len(pis), len(succeeded), len(dups), passes, deferred, time.Since(start).Round(time.Millisecond))
	if len(dups) != 0 {
		t.Fatalf("references with two PaymentIntents: %v", dups)
	}
	if len(pis) != len(intents) || len(succeeded) != len(intents) {
		t.Fatalf("%d PaymentIntents, %d references captured; want one each for %d intents", len(pis), len(succeeded), len(intents))
	}
}

// TestStripeKeyWindowOnTheDatabaseClock: the key window is measured on one
// clock, the database's. Here the instance's clock runs an hour behind the
// database's: measured against it, a reference whose key Stripe has
// already forgotten looks young, and a re-send would create a second
// PaymentIntent. Recovery must search instead, and find the first.
func TestStripeKeyWindowOnTheDatabaseClock(t *testing.T) {
	t.Parallel()
	const (
		keyTTL = 300 * time.Millisecond // the fake forgets keys
		window = 200 * time.Millisecond // the adapter trusts keys this long
		n      = 4
	)
	fake := stripetest.New(stripetest.Options{Key: "sk_test_clock", KeyTTL: keyTTL})
	srv := httptest.NewServer(fake)
	t.Cleanup(srv.Close)
	noRetries := int64(0)
	behind := func() time.Time { return time.Now().Add(-time.Hour) }
	acq, err := stripe.New(stripe.Options{Key: "sk_test_clock", APIBase: srv.URL, KeyWindow: window, SearchLag: window,
		MaxNetworkRetries: &noRetries, Now: behind})
	if err != nil {
		t.Fatal(err)
	}
	e := setup(t, nil, engine.Options{BackoffBase: 50 * time.Millisecond, BackoffMax: 100 * time.Millisecond})
	eng := engine.New(e.store, acq, e.eng.Options())
	var keys []string
	for i := range n {
		key := fmt.Sprintf("lost-%d", i)
		if resp, err := eng.Charge(t.Context(), "demo", key, request(stripetest.PMFailAfter)); err != nil || resp.Status != 202 {
			t.Fatalf("%s: %d %s, %v; want 202 (the answer was lost)", key, resp.Status, resp.Body, err)
		}
		keys = append(keys, key)
	}
	time.Sleep(keyTTL + 100*time.Millisecond) // Stripe forgets the keys
	settle(t, e.store, recovery.NewRescuer(e.store, eng, recovery.RescuerOptions{BackoffBase: 50 * time.Millisecond, BackoffMax: 100 * time.Millisecond}), keys)
	if dups := fake.Duplicates(); len(dups) != 0 {
		t.Fatalf("references with two PaymentIntents: %v (the key window was measured on the instance's clock)", dups)
	}
	if got := len(fake.Intents()); got != n {
		t.Fatalf("%d PaymentIntents for %d intents", got, n)
	}
}

// TestStripeProcessingIsRetrieved: a PaymentIntent left processing (an
// asynchronous payment method) is not settled by re-sending its request,
// whose key replays "processing" for as long as Stripe keeps it. Its id is
// recorded and recovery retrieves it until it leaves processing.
func TestStripeProcessingIsRetrieved(t *testing.T) {
	t.Parallel()
	fake := stripetest.New(stripetest.Options{Key: "sk_test_async", Processing: time.Second})
	srv := httptest.NewServer(fake)
	t.Cleanup(srv.Close)
	acq, err := stripe.New(stripe.Options{Key: "sk_test_async", APIBase: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	e := setup(t, nil, engine.Options{BackoffBase: 50 * time.Millisecond, BackoffMax: 100 * time.Millisecond})
	eng := engine.New(e.store, acq, e.eng.Options())
	req := request(stripetest.PMProcessing)
	if resp, err := eng.Charge(t.Context(), "demo", "async", req); err != nil || resp.Status != 202 {
		t.Fatalf("a processing PaymentIntent: %d %s, %v; want 202", resp.Status, resp.Body, err)
	}
	if rec := get(t, e.store, "async"); rec.AcquirerID == "" {
		t.Fatalf("the PaymentIntent's id was not recorded: %+v", rec)
	}
	settle(t, e.store, recovery.NewRescuer(e.store, eng, recovery.RescuerOptions{BackoffBase: 50 * time.Millisecond, BackoffMax: 100 * time.Millisecond}), []string{"async"})
	wantReplay(t, &env{store: e.store, eng: eng}, "async", req, 201)
	if got := len(fake.Intents()); got != 1 {
		t.Fatalf("%d PaymentIntents, want 1", got)
	}
}

// settle runs recovery passes until every key is settled, for at most 10 s.
func settle(t *testing.T, s chargeonce.Store, r *recovery.Rescuer, keys []string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := r.RunOnce(t.Context()); err != nil {
			t.Fatal(err)
		}
		pending := 0
		for _, k := range keys {
			if get(t, s, k).State == chargeonce.KeyProcessing {
				pending++
			}
		}
		if pending == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d intents still processing after 10 s of recovery", pending, len(keys))
		}
		time.Sleep(60 * time.Millisecond)
	}
}
