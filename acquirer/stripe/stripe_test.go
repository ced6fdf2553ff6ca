package stripe_test

import (
	"errors"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/acquirer/stripe"
	"github.com/chargeonce/chargeonce/acquirer/stripetest"
)

const testKey = "sk_test_chargeonce"

type env struct {
	fake *stripetest.Fake
	acq  *stripe.Acquirer
	url  string
}

// setup starts a fake Stripe and an adapter for it. retries is stripe-go's
// MaxNetworkRetries.
func setup(t *testing.T, fo stripetest.Options, o stripe.Options, retries int64) *env {
	t.Helper()
	fo.Key = testKey
	fake := stripetest.New(fo)
	srv := httptest.NewServer(fake)
	t.Cleanup(srv.Close)
	o.Key, o.APIBase, o.MaxNetworkRetries = testKey, srv.URL, &retries
	acq, err := stripe.New(o)
	if err != nil {
		t.Fatal(err)
	}
	return &env{fake: fake, acq: acq, url: srv.URL}
}

func capture(ref, pm string) chargeonce.CaptureRequest {
	return chargeonce.CaptureRequest{Reference: ref, OrderID: 42, Merchant: "demo", AmountCents: 1990, Currency: "BRL", PaymentToken: pm}
}

// TestCaptureOutcomes: each Stripe outcome maps to its class: captured,
// declined (with Stripe's decline_code, or authentication_required for
// 3-D Secure), rejected (a 4xx about the request) or unknown (5xx, 429,
// idempotency errors, a wrong key, the network).
func TestCaptureOutcomes(t *testing.T) {
	t.Parallel()
	e := setup(t, stripetest.Options{}, stripe.Options{}, 0)
	ctx := t.Context()
	for _, tc := range []struct {
		pm       string
		status   chargeonce.Status
		decline  string
		rejected bool
		unknown  bool
	}{
		{pm: stripetest.PMOK, status: chargeonce.StatusCaptured},
		{pm: stripetest.PMInsufficientFunds, status: chargeonce.StatusDeclined, decline: stripetest.DeclineInsufficient},
		{pm: stripetest.PMDeclined, status: chargeonce.StatusDeclined, decline: stripetest.DeclineGenericDecline},
		{pm: stripetest.PMAuthRequired, status: chargeonce.StatusDeclined, decline: stripe.DeclineAuthenticationRequired},
		{pm: stripetest.PMInvalid, rejected: true},
		{pm: stripetest.PMFailBefore, unknown: true},
		{pm: stripetest.PMFailAfter, unknown: true},
		{pm: stripetest.PMRateLimited, unknown: true},
	} {
		t.Run(tc.pm, func(t *testing.T) {
			ref := "ch_" + tc.pm
			res, err := e.acq.Capture(ctx, capture(ref, tc.pm))
			switch {
			case tc.rejected:
				if !errors.Is(err, chargeonce.ErrCaptureRejected) {
					t.Fatalf("Capture = %+v, %v; want a rejection", res, err)
				}
			case tc.unknown:
				if err == nil || errors.Is(err, chargeonce.ErrCaptureRejected) {
					t.Fatalf("Capture = %+v, %v; want an unknown outcome", res, err)
				}
			default:
				want := chargeonce.CaptureResult{Reference: ref, Status: tc.status, DeclineCode: tc.decline}
				if err != nil || res != want {
					t.Fatalf("Capture = %+v, %v; want %+v", res, err, want)
				}
			}
			t.Logf("%s: %+v, %v", tc.pm, res, err)
		})
	}

	// The request carries what the SPEC says.
	var found bool
	for _, r := range e.fake.Requests() {
		if r.Form.Get("metadata[chargeonce_reference]") != "ch_"+stripetest.PMOK {
			continue
		}
		found = true
		for k, want := range map[string]string{
			"amount": "1990", "currency": "brl", "payment_method": stripetest.PMOK, "confirm": "true",
			"metadata[order_id]": "42", "metadata[merchant]": "demo",
		} {
			if got := r.Form.Get(k); got != want {
				t.Errorf("%s = %q, want %q", k, got, want)
			}
		}
		if r.IdempotencyKey != "ch_"+stripetest.PMOK {
			t.Errorf("Idempotency-Key = %q, want the reference", r.IdempotencyKey)
		}
	}
	if !found {
		t.Fatal("no create request for ch_pm_card_visa")
	}
}

// TestCaptureUnknownOutcomes: a wrong key, a changed request under the same
// key (idempotency_error) and an unreachable Stripe are unknown outcomes,
// never rejections that would settle the charge as declined.
func TestCaptureUnknownOutcomes(t *testing.T) {
	t.Parallel()
	e := setup(t, stripetest.Options{}, stripe.Options{}, 0)
	ctx := t.Context()

	wrong, err := stripe.New(stripe.Options{Key: "sk_test_wrong", APIBase: e.url})
	if err != nil {
		t.Fatal(err)
	}
	if res, err := wrong.Capture(ctx, capture("ch_key", stripetest.PMOK)); err == nil || errors.Is(err, chargeonce.ErrCaptureRejected) {
		t.Fatalf("wrong key: %+v, %v; want unknown", res, err)
	}

	if _, err := e.acq.Capture(ctx, capture("ch_idem", stripetest.PMOK)); err != nil {
		t.Fatal(err)
	}
	changed := capture("ch_idem", stripetest.PMOK)
	changed.AmountCents++
	if res, err := e.acq.Capture(ctx, changed); err == nil || errors.Is(err, chargeonce.ErrCaptureRejected) {
		t.Fatalf("idempotency_error: %+v, %v; want unknown", res, err)
	} else {
		t.Logf("idempotency_error: %v", err)
	}

	gone, err := stripe.New(stripe.Options{Key: testKey, APIBase: "http://127.0.0.1:9"})
	if err != nil {
		t.Fatal(err)
	}
	if res, err := gone.Capture(ctx, capture("ch_net", stripetest.PMOK)); err == nil || errors.Is(err, chargeonce.ErrCaptureRejected) {
		t.Fatalf("unreachable: %+v, %v; want unknown", res, err)
	}
}

// TestRetriesKeepTheKey: stripe-go's own retries (after a network error)
// re-send the request with the same Idempotency-Key, so an answer lost after
// the PaymentIntent was committed is answered by the replay and one
// PaymentIntent exists. (net/http's Transport, too, re-sends a request
// carrying an Idempotency-Key when a reused connection breaks, keeping it.)
func TestRetriesKeepTheKey(t *testing.T) {
	t.Parallel()
	e := setup(t, stripetest.Options{}, stripe.Options{}, 2)
	for _, pm := range []string{stripetest.PMDropAfter} {
		ref := "ch_retry_" + pm
		res, err := e.acq.Capture(t.Context(), capture(ref, pm))
		if err != nil || res.Status != chargeonce.StatusCaptured {
			t.Fatalf("%s: Capture = %+v, %v; want captured by stripe-go's retry", pm, res, err)
		}
		var keys []string
		for _, r := range e.fake.Requests() {
			if r.Form.Get("metadata[chargeonce_reference]") == ref {
				keys = append(keys, r.IdempotencyKey)
			}
		}
		if len(keys) < 2 {
			t.Fatalf("%s: %d requests; want the lost one and its retry", pm, len(keys))
		}
		for _, k := range keys {
			if k != ref {
				t.Fatalf("%s: requests' keys %q; want every one the reference", pm, keys)
			}
		}
	}
	if d := e.fake.Duplicates(); len(d) != 0 {
		t.Fatalf("references with two PaymentIntents: %v", d)
	}
}

// TestLookupIsHonest: within the key window a re-send is safe without
// asking; after it, a PaymentIntent found settles the reference, and a
// search miss is safe to send only for a reference older than the search
// lag: younger, the miss may be the index lagging behind.
func TestLookupIsHonest(t *testing.T) {
	t.Parallel()
	const window, lag = time.Hour, 10 * time.Minute
	const fakeLag = 2 * time.Second
	e := setup(t, stripetest.Options{SearchLag: fakeLag}, stripe.Options{KeyWindow: window, SearchLag: lag}, 0)
	ctx := t.Context()
	now := time.Now()
	lookup := func(ref string, firstSent time.Time) chargeonce.LookupResult {
		t.Helper()
		lr, err := e.acq.Lookup(ctx, chargeonce.LookupRequest{Reference: ref, Age: now.Sub(firstSent), AgeKnown: true})
		if err != nil {
			t.Fatalf("Lookup(%s): %v", ref, err)
		}
		t.Logf("Lookup(%s, age %s) = %+v", ref, now.Sub(firstSent).Round(time.Minute), lr)
		return lr
	}

	if _, err := e.acq.Capture(ctx, capture("ch_lost", stripetest.PMFailAfter)); err == nil {
		t.Fatal("pm_fail_after with retries off: want an unknown outcome")
	}
	if _, err := e.acq.Capture(ctx, capture("ch_dec", stripetest.PMInsufficientFunds)); err != nil {
		t.Fatal(err)
	}
	if lr := lookup("ch_lost", now.Add(-time.Minute)); lr.Status != chargeonce.LookupSafeToSend {
		t.Fatalf("within the key window: %v; want safe to send", lr.Status)
	}
	// The search index has not seen the new PaymentIntent yet.
	if lr := lookup("ch_lost", now.Add(-window-time.Minute)); lr.Status != chargeonce.LookupSafeToSend {
		// A reference this old is past the lag, so the miss is trusted: a
		// PaymentIntent this young would have to come from a request with
		// the same key, still kept, so a re-send replays it.
		t.Fatalf("past the window and the lag: %v", lr.Status)
	}
	if res, err := e.acq.Capture(ctx, capture("ch_lost", stripetest.PMFailAfter)); err != nil || res.Status != chargeonce.StatusCaptured {
		t.Fatalf("the re-send: %+v, %v; want the replayed capture", res, err)
	}
	if d := e.fake.Duplicates(); len(d) != 0 {
		t.Fatalf("references with two PaymentIntents: %v", d)
	}
	e2 := setup(t, stripetest.Options{SearchLag: time.Hour}, stripe.Options{KeyWindow: time.Minute, SearchLag: lag}, 0)
	if lr, err := e2.acq.Lookup(ctx, chargeonce.LookupRequest{Reference: "ch_young", Age: 5 * time.Minute, AgeKnown: true}); err != nil || lr.Status != chargeonce.LookupUnsure || lr.RetryAfter <= 0 {
		t.Fatalf("a miss younger than the lag = %+v, %v; want unsure with a RetryAfter", lr, err)
	}
	if lr, err := e2.acq.Lookup(ctx, chargeonce.LookupRequest{Reference: "ch_unknown_age"}); err != nil || lr.Status != chargeonce.LookupUnsure {
		t.Fatalf("a miss of unknown age = %+v, %v; want unsure", lr, err)
	}

	time.Sleep(fakeLag) // the index catches up
	if lr := lookup("ch_lost", now.Add(-window-time.Minute)); lr.Status != chargeonce.LookupFound || lr.Result.Status != chargeonce.StatusCaptured {
		t.Fatalf("after the lag: %+v; want found, captured", lr)
	}
	if lr := lookup("ch_dec", now.Add(-window-time.Minute)); lr.Status != chargeonce.LookupFound || lr.Result.DeclineCode != stripetest.DeclineInsufficient {
		t.Fatalf("a declined PaymentIntent: %+v; want found, insufficient_funds", lr)
	}
}

// TestRetryAfter: a 429 or 503 carrying Retry-After is an unknown outcome
// whose error says how long Stripe asked to wait (the engine holds the
// charge back that long); other unknown outcomes say nothing.
func TestRetryAfter(t *testing.T) {
	t.Parallel()
	e := setup(t, stripetest.Options{RetryAfter: 3 * time.Second}, stripe.Options{}, 0)
	for _, tc := range []struct {
		pm   string
		want time.Duration
	}{
		{stripetest.PMRateLimited, 3 * time.Second},
		{stripetest.PMUnavailable, 3 * time.Second},
		{stripetest.PMFailBefore, 0},
	} {
		_, err := e.acq.Capture(t.Context(), capture("ch_ra_"+tc.pm, tc.pm))
		if err == nil || errors.Is(err, chargeonce.ErrCaptureRejected) {
			t.Fatalf("%s: %v; want an unknown outcome", tc.pm, err)
		}
		var got time.Duration
		if ra, ok := errors.AsType[interface {
			error
			RetryAfter() time.Duration
		}](err); ok {
			got = ra.RetryAfter()
		}
		if got != tc.want {
			t.Errorf("%s: RetryAfter %s; want %s (%v)", tc.pm, got, tc.want, err)
		}
	}
}

// TestRetrieveBindsOperators: a lookup of a known PaymentIntent id
// retrieves it, and says where Stripe's own state binds an operator: one
// that requires action can never be called captured, one that is
// processing never declined (and stays unsure until it moves on).
func TestRetrieveBindsOperators(t *testing.T) {
	t.Parallel()
	e := setup(t, stripetest.Options{Processing: time.Hour}, stripe.Options{}, 0)
	ctx := t.Context()
	if res, err := e.acq.Capture(ctx, capture("ch_3ds", stripetest.PMAuthRequired)); err != nil || res.DeclineCode != stripe.DeclineAuthenticationRequired {
		t.Fatalf("requires_action: %+v, %v", res, err)
	}
	_, err := e.acq.Capture(ctx, capture("ch_async", stripetest.PMProcessing))
	open, ok := errors.AsType[chargeonce.AcquirerIDError](err)
	if !ok || open.AcquirerID() == "" {
		t.Fatalf("a processing PaymentIntent: %v; want an unknown outcome naming its id", err)
	}
	ids := map[string]string{}
	for _, pi := range e.fake.Intents() {
		ids[pi.Metadata[stripe.MetaReference]] = pi.ID
	}
	if open.AcquirerID() != ids["ch_async"] {
		t.Fatalf("the error names %s, the PaymentIntent is %s", open.AcquirerID(), ids["ch_async"])
	}
	lookup := func(ref string) chargeonce.LookupResult {
		t.Helper()
		lr, err := e.acq.Lookup(ctx, chargeonce.LookupRequest{Reference: ref, AcquirerID: ids[ref], Purpose: chargeonce.LookupToResolve})
		if err != nil {
			t.Fatalf("Lookup(%s): %v", ref, err)
		}
		return lr
	}
	if lr := lookup("ch_3ds"); lr.Status != chargeonce.LookupFound || lr.Result.Status != chargeonce.StatusDeclined || !lr.Binding {
		t.Fatalf("requires_action: %+v; want found, declined, binding", lr)
	}
	if lr := lookup("ch_async"); lr.Status != chargeonce.LookupUnsure || !lr.Open() || !lr.Binding || lr.AcquirerID != ids["ch_async"] {
		t.Fatalf("processing: %+v; want unsure, open, binding", lr)
	}
	if _, err := e.acq.Lookup(ctx, chargeonce.LookupRequest{Reference: "ch_other", AcquirerID: ids["ch_async"]}); err == nil {
		t.Fatal("a PaymentIntent of another reference: want an error")
	}
}

// TestAmountsInMinorUnits: a charge's amount is the currency's ISO 4217
// minor unit, and reaches Stripe as Stripe counts it: ¥1,000 is 1000, 1,000
// fils 1000, 1,000 ISK 100000 (Stripe's two-decimal ISK); a KWD amount not
// ending in 0 or a fraction of an ariary is refused before Stripe is
// called, never rounded.
func TestAmountsInMinorUnits(t *testing.T) {
	t.Parallel()
	e := setup(t, stripetest.Options{}, stripe.Options{}, 0)
	for i, tc := range []struct {
		minor    int64
		currency string
		want     int64 // 0: refused
	}{
		{1000, "JPY", 1000},
		{1000, "KWD", 1000},
		{1990, "BRL", 1990},
		{1000, "ISK", 100000},
		{150000, "MGA", 1500},
		{1005, "KWD", 0},
		{150050, "MGA", 0},
	} {
		req := capture(fmt.Sprintf("ch_amount_%d", i), stripetest.PMOK)
		req.AmountCents, req.Currency = tc.minor, tc.currency
		before := len(e.fake.Intents())
		res, err := e.acq.Capture(t.Context(), req)
		if tc.want == 0 {
			if !errors.Is(err, chargeonce.ErrCaptureRejected) || len(e.fake.Intents()) != before {
				t.Errorf("%d %s: %+v, %v; want a rejection and no PaymentIntent", tc.minor, tc.currency, res, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%d %s: %v", tc.minor, tc.currency, err)
		}
		pis := e.fake.Intents()
		if got := pis[len(pis)-1]; got.Amount != tc.want || got.Currency != strings.ToLower(tc.currency) {
			t.Errorf("%s (amount_cents %d): Stripe got %d %s; want %d", chargeonce.FormatAmount(tc.minor, tc.currency), tc.minor, got.Amount, got.Currency, tc.want)
		}
	}
}
