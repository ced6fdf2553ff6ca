package acquirertest_test

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/acquirer/acquirertest"
	"github.com/chargeonce/chargeonce/acquirer/stripe"
	"github.com/chargeonce/chargeonce/acquirer/stripetest"
)

// keyTTL is how long the acquirers behind the harnesses keep a key: short,
// so that the suite looks references up after they were forgotten, long
// enough that three sends of one reference on a loaded machine fall within
// it.
const keyTTL = 2 * time.Second

func simCaptures(sim *acquirer.Simulator) func(string) int {
	return func(ref string) int {
		sim.Wait()
		n := 0
		for _, c := range sim.Captures() {
			if c.Reference == ref && c.Status == chargeonce.StatusCaptured {
				n++
			}
		}
		return n
	}
}

func simHarness(t *testing.T, overHTTP bool) acquirertest.Harness {
	sim := acquirer.NewSimulator(acquirer.Options{IdempotencyWindow: keyTTL})
	t.Cleanup(func() { _ = sim.Close() })
	h := acquirertest.Harness{Acquirer: sim, OK: acquirer.TokenOK, Declined: acquirer.TokenDeclined, LostAnswer: acquirer.TokenFailAfter,
		Captures: simCaptures(sim), KeyTTL: keyTTL,
		Refunds: func(ref string) int {
			if rf, ok := sim.GetRefund(ref); ok && rf.Status == chargeonce.RefundSucceeded {
				return 1 // the simulator keeps one refund per reference
			}
			return 0
		},
		Refunded: sim.RefundedCents}
	if overHTTP {
		srv := httptest.NewServer(acquirer.Handler(sim))
		t.Cleanup(srv.Close)
		h.Acquirer = acquirer.NewClient(srv.URL, nil)
	}
	return h
}

// stripeHarness is the Stripe adapter in front of the fake, which forgets
// keys after keyTTL and whose search lags 200 ms; the adapter trusts a key
// for less than the fake keeps it, and allows the search a longer lag, as
// it does with Stripe's own numbers. transport, when set, carries its
// requests.
func stripeHarness(t *testing.T, transport http.RoundTripper) acquirertest.Harness {
	fake := stripetest.New(stripetest.Options{Key: "sk_test_suite", KeyTTL: keyTTL, SearchLag: 200 * time.Millisecond})
	srv := httptest.NewServer(fake)
	t.Cleanup(srv.Close)
	noRetries := int64(0)
	acq, err := stripe.New(stripe.Options{Key: "sk_test_suite", APIBase: srv.URL, MaxNetworkRetries: &noRetries,
		KeyWindow: keyTTL * 3 / 4, SearchLag: 3 * time.Second, HTTPClient: &http.Client{Transport: transport}})
	if err != nil {
		t.Fatal(err)
	}
	return acquirertest.Harness{Acquirer: acq, OK: stripetest.PMOK, Declined: stripetest.PMInsufficientFunds, LostAnswer: stripetest.PMFailAfter,
		Captures: func(ref string) int { return fake.Succeeded()[ref] }, KeyTTL: keyTTL,
		Refunds: fake.RefundsOf, Refunded: fake.RefundedCents}
}

func TestSimulator(t *testing.T) {
	t.Parallel()
	acquirertest.Run(t, func(t *testing.T) acquirertest.Harness { return simHarness(t, false) })
}

func TestHTTPClient(t *testing.T) {
	t.Parallel()
	acquirertest.Run(t, func(t *testing.T) acquirertest.Harness { return simHarness(t, true) })
}

func TestStripe(t *testing.T) {
	t.Parallel()
	acquirertest.Run(t, func(t *testing.T) acquirertest.Harness { return stripeHarness(t, nil) })
}

func TestSimulatorRefunds(t *testing.T) {
	t.Parallel()
	acquirertest.RunRefunds(t, func(t *testing.T) acquirertest.Harness { return simHarness(t, false) })
}

func TestHTTPClientRefunds(t *testing.T) {
	t.Parallel()
	acquirertest.RunRefunds(t, func(t *testing.T) acquirertest.Harness { return simHarness(t, true) })
}

func TestStripeRefunds(t *testing.T) {
	t.Parallel()
	acquirertest.RunRefunds(t, func(t *testing.T) acquirertest.Harness { return stripeHarness(t, nil) })
}

func TestSimulatorManualCapture(t *testing.T) {
	t.Parallel()
	acquirertest.RunManualCapture(t, func(t *testing.T) acquirertest.Harness { return simHarness(t, false) })
}

func TestHTTPClientManualCapture(t *testing.T) {
	t.Parallel()
	acquirertest.RunManualCapture(t, func(t *testing.T) acquirertest.Harness { return simHarness(t, true) })
}

func TestStripeManualCapture(t *testing.T) {
	t.Parallel()
	acquirertest.RunManualCapture(t, func(t *testing.T) acquirertest.Harness { return stripeHarness(t, nil) })
}
