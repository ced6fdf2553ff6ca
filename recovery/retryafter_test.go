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

// TestRecoveryHonoursRetryAfter: Stripe answers 429 and 503 with a
// Retry-After header of 2 s. The engine's back-off is 50 ms, and recovery
// passes run every 50 ms, yet neither a client's attempt nor recovery sends
// the reference again before Stripe's Retry-After has passed: the 202 says
// so in its own Retry-After, and the second request for every reference
// reaches Stripe at least 2 s after the first.
func TestRecoveryHonoursRetryAfter(t *testing.T) {
	t.Parallel()
	const retryAfter = 2 * time.Second
	fake := stripetest.New(stripetest.Options{Key: "sk_test_retry", RetryAfter: retryAfter})
	srv := httptest.NewServer(fake)
	t.Cleanup(srv.Close)
	noRetries := int64(0)
	acq, err := stripe.New(stripe.Options{Key: "sk_test_retry", APIBase: srv.URL, MaxNetworkRetries: &noRetries})
	if err != nil {
		t.Fatal(err)
	}
	fast := engine.Options{BackoffBase: 50 * time.Millisecond, BackoffMax: 100 * time.Millisecond}
	e := setup(t, nil, fast)
	eng := engine.New(e.store, acq, e.eng.Options())
	ctx := t.Context()

	type intent struct {
		key string
		req *chargeonce.ChargeRequest
		ref string
	}
	var intents []intent
	for i := range 4 {
		for _, pm := range []string{stripetest.PMRateLimited, stripetest.PMUnavailable} {
			in := intent{key: fmt.Sprintf("%s-%d", pm, i), req: request(pm)}
			resp, err := eng.Charge(ctx, "demo", in.key, in.req)
			if err != nil || resp.Status != 202 {
				t.Fatalf("%s: %d %s, %v; want 202 (outcome unknown)", in.key, resp.Status, resp.Body, err)
			}
			if resp.RetryAfter < retryAfter {
				t.Errorf("%s: the 202 says Retry-After %s; want at least Stripe's %s", in.key, resp.RetryAfter, retryAfter)
			}
			in.ref = get(t, e.store, in.key).Charge.ID
			intents = append(intents, in)
		}
	}

	r := recovery.NewRescuer(e.store, eng, recovery.RescuerOptions{BackoffBase: 50 * time.Millisecond, BackoffMax: 100 * time.Millisecond})
	start := time.Now()
	passes := 0
	for pending := len(intents); pending > 0; {
		if time.Since(start) > 60*time.Second {
			t.Fatalf("%d intents still processing after 60s", pending)
		}
		if _, err := r.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
		passes++
		pending = 0
		for _, in := range intents {
			if get(t, e.store, in.key).State == chargeonce.KeyProcessing {
				pending++
			}
		}
		time.Sleep(50 * time.Millisecond)
	}

	sent := map[string][]time.Time{}
	for _, rq := range fake.Requests() {
		if rq.Path == "/v1/payment_intents" {
			ref := rq.Form.Get("metadata[chargeonce_reference]")
			sent[ref] = append(sent[ref], rq.At)
		}
	}
	shortest := time.Duration(1<<63 - 1)
	for _, in := range intents {
		wantReplay(t, &env{store: e.store, eng: eng}, in.key, in.req, 201)
		at := sent[in.ref]
		if len(at) != 2 {
			t.Fatalf("%s: %d create requests; want the refused one and one re-drive", in.key, len(at))
		}
		gap := at[1].Sub(at[0])
		shortest = min(shortest, gap)
		// The database's clock ends the lease; allow it a little.
		if gap < retryAfter-100*time.Millisecond {
			t.Errorf("%s: re-driven %s after Stripe asked for %s", in.key, gap.Round(time.Millisecond), retryAfter)
		}
	}
	if d := fake.Duplicates(); len(d) != 0 {
		t.Fatalf("references with two PaymentIntents: %v", d)
	}
	t.Logf("%d intents refused with Retry-After %s; the earliest re-drive came %s after its refusal; %d passes in %s",
		len(intents), retryAfter, shortest.Round(time.Millisecond), passes, time.Since(start).Round(time.Millisecond))
}
