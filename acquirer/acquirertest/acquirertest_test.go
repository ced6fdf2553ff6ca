package acquirertest_test

import (
	"net/http/httptest"
	"testing"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/acquirer/acquirertest"
	"github.com/chargeonce/chargeonce/acquirer/stripe"
	"github.com/chargeonce/chargeonce/acquirer/stripetest"
)

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
	sim := acquirer.NewSimulator(acquirer.Options{})
	t.Cleanup(func() { _ = sim.Close() })
	h := acquirertest.Harness{Acquirer: sim, OK: acquirer.TokenOK, Declined: acquirer.TokenDeclined, LostAnswer: acquirer.TokenFailAfter, Captures: simCaptures(sim)}
	if overHTTP {
		srv := httptest.NewServer(acquirer.Handler(sim))
		t.Cleanup(srv.Close)
		h.Acquirer = acquirer.NewClient(srv.URL, nil)
	}
	return h
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
	acquirertest.Run(t, func(t *testing.T) acquirertest.Harness {
		fake := stripetest.New(stripetest.Options{Key: "sk_test_suite"})
		srv := httptest.NewServer(fake)
		t.Cleanup(srv.Close)
		noRetries := int64(0)
		acq, err := stripe.New(stripe.Options{Key: "sk_test_suite", APIBase: srv.URL, MaxNetworkRetries: &noRetries})
		if err != nil {
			t.Fatal(err)
		}
		return acquirertest.Harness{Acquirer: acq, OK: stripetest.PMOK, Declined: stripetest.PMInsufficientFunds, LostAnswer: stripetest.PMFailAfter,
			Captures: func(ref string) int { return fake.Succeeded()[ref] }}
	})
}
