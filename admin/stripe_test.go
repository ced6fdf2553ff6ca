package admin_test

import (
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/acquirer/stripe"
	"github.com/chargeonce/chargeonce/acquirer/stripetest"
	"github.com/chargeonce/chargeonce/admin"
	"github.com/chargeonce/chargeonce/internal/apitest"
)

// stripeEnv is a merchant API and an admin API on the Stripe adapter,
// against the stateful fake.
type stripeEnv struct {
	env
	fake *stripetest.Fake
}

func setupStripe(t *testing.T, kind string, fo stripetest.Options, so stripe.Options) *stripeEnv {
	t.Helper()
	e := &stripeEnv{env: env{store: apitest.Store(t, kind), logs: &apitest.Buffer{}}, fake: stripetest.New(fo)}
	e.orders.Store(time.Now().UnixNano() % 1e9 * 1000)
	srv := httptest.NewServer(e.fake)
	t.Cleanup(srv.Close)
	noRetries := int64(0)
	so.Key, so.APIBase, so.MaxNetworkRetries = "sk_test_admin", srv.URL, &noRetries
	acq, err := stripe.New(so)
	if err != nil {
		t.Fatal(err)
	}
	e.api = apitest.Start(t, e.store, acq, testOptions)
	a, err := admin.New(admin.Config{Store: e.store, Acquirer: acq, Keys: adminKeys(t), Lease: testOptions.Lease,
		AcquirerTimeout: testOptions.AcquirerTimeout, Logger: newLogger(e.logs)})
	if err != nil {
		t.Fatal(err)
	}
	e.admin = httptest.NewServer(a)
	t.Cleanup(e.admin.Close)
	return e
}

// lost charges with pm_fail_after: Stripe commits the PaymentIntent (it
// succeeds) and the answer is lost, so the charge is 202, backed off.
func (e *stripeEnv) lost(t *testing.T, key string) string {
	t.Helper()
	body := fmt.Sprintf(`{"order_id":%d,"amount_cents":2500,"payment_token":%q}`, e.orders.Add(1), stripetest.PMFailAfter)
	r := apitest.Charge(t, e.api.URL, key, body)
	var ch struct{ ID string }
	if r.Status != 202 || json.Unmarshal(r.Body, &ch) != nil {
		t.Fatalf("pm_fail_after: %d %s, want 202", r.Status, r.Body)
	}
	return ch.ID
}

// TestResolveAsksStripeWhatHappened: a resolution under the Stripe adapter
// asks Stripe what became of the PaymentIntent, never only whether a
// re-send would be safe. A PaymentIntent that succeeded cannot be declined,
// not even with force; one that Stripe's search cannot see yet is unsure.
func TestResolveAsksStripeWhatHappened(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"postgres", "sqlite"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			e := setupStripe(t, kind, stripetest.Options{Key: "sk_test_admin"}, stripe.Options{SearchLag: time.Hour})
			id := e.lost(t, "lost")
			path := "/admin/v1/charges/" + id + "/resolve"
			decline := admin.ResolveRequest{Status: chargeonce.StatusDeclined, Reason: "the customer says it failed"}
			st, b := e.call(t, "POST", path, bobKey, decline)
			if st != 409 || problemType(b) != chargeonce.EDISAGREES || !strings.Contains(string(b), "succeeded") {
				t.Fatalf("declining a succeeded PaymentIntent: %d %s, want 409 %s naming it", st, b, chargeonce.EDISAGREES)
			}
			decline.Force = true
			if st, b := e.call(t, "POST", path, bobKey, decline); st != 409 || problemType(b) != chargeonce.EDISAGREES {
				t.Fatalf("forcing a decline of a succeeded PaymentIntent: %d %s, want 409 %s", st, b, chargeonce.EDISAGREES)
			}
			st, b = e.call(t, "POST", path, bobKey, admin.ResolveRequest{Status: chargeonce.StatusCaptured, Reason: "Stripe says succeeded"})
			var res struct{ Audit admin.EntryJSON }
			if st != 200 || json.Unmarshal(b, &res) != nil || res.Audit.Forced || !strings.Contains(res.Audit.Detail, "succeeded") {
				t.Fatalf("resolving as Stripe says: %d %s", st, b)
			}

			// Within Stripe's search lag a miss proves nothing.
			lagging := setupStripe(t, kind, stripetest.Options{Key: "sk_test_admin", SearchLag: time.Hour}, stripe.Options{SearchLag: time.Hour})
			id = lagging.lost(t, "lost-lagging")
			st, b = lagging.call(t, "POST", "/admin/v1/charges/"+id+"/resolve", bobKey,
				admin.ResolveRequest{Status: chargeonce.StatusDeclined, Reason: "nothing at Stripe"})
			if st != 409 || problemType(b) != chargeonce.EUNSURE {
				t.Fatalf("declining what Stripe's search cannot see yet: %d %s, want 409 %s", st, b, chargeonce.EUNSURE)
			}
			if n := len(lagging.fake.Intents()); n != 1 {
				t.Fatalf("%d PaymentIntents, want 1: a resolution never sends", n)
			}
		})
	}
}
