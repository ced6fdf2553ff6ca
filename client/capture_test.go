package client_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/client"
	"github.com/chargeonce/chargeonce/engine"
)

// TestCaptureRetriedUntilFinal: a manual charge authorizes; its capture,
// whose first answer is lost at the acquirer (tok_fail_after), is answered
// 202 and retried with the same key and body until the 200, and the
// acquirer captures once. A second capture and a cancel of the captured
// charge are final *ValidationErrors (charge-not-authorized), not retried,
// and a cancel of another authorization returns it canceled.
func TestCaptureRetriedUntilFinal(t *testing.T) {
	t.Parallel()
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			f := setup(t, kind, engine.Options{BackoffBase: 20 * time.Millisecond, BackoffMax: 50 * time.Millisecond}, acquirer.Options{})
			var log attemptLog
			c := newClient(t, f.inst.URL, log.hook())
			req := charge(orderSeq.Add(1), acquirer.TokenFailAfter)
			req.CaptureMethod = client.CaptureManual
			ch, err := c.CreateCharge(context.Background(), req)
			if err != nil {
				t.Fatalf("CreateCharge: %v", err)
			}
			if ch.Status != client.StatusAuthorized || ch.CaptureMethod != client.CaptureManual || ch.AmountCapturedCents != 0 {
				t.Fatalf("manual charge: %+v", ch)
			}
			key := client.NewIdempotencyKey()
			got, err := c.Capture(context.Background(), ch.ID, key, 1500)
			if err != nil {
				t.Fatalf("Capture: %v", err)
			}
			if got.Status != client.StatusCaptured || got.AmountCapturedCents != 1500 || got.ID != ch.ID || got.Attempts < 2 {
				t.Fatalf("captured %+v; want captured 1500 after a 202", got)
			}
			atts, _ := log.attempts()
			var capAtts []client.Attempt
			for _, a := range atts {
				if strings.HasSuffix(a.Path, "/capture") {
					capAtts = append(capAtts, a)
					if a.Key != key {
						t.Fatalf("attempt %+v with another key than %s", a, key)
					}
				}
			}
			if len(capAtts) < 2 || capAtts[0].Status != 202 || capAtts[len(capAtts)-1].Status != 200 {
				t.Fatalf("capture attempts %+v; want 202 first and 200 last", capAtts)
			}
			if st := f.sim.Stats(); st.AuthorizationCaptures != 1 || st.OperationRequests != 1 {
				t.Fatalf("acquirer %+v; want one capture request", st)
			}
			again, err := c.Capture(context.Background(), ch.ID, key, 1500)
			if err != nil || !again.Replayed || again.AmountCapturedCents != 1500 {
				t.Fatalf("the capture again with its key: %+v, %v; want the replay", again, err)
			}
			for name, call := range map[string]func() (*client.Charge, error){
				"capture": func() (*client.Charge, error) { return c.Capture(context.Background(), ch.ID, "", 0) },
				"cancel":  func() (*client.Charge, error) { return c.Cancel(context.Background(), ch.ID, "") },
			} {
				_, err := call()
				var ve *client.ValidationError
				if !errors.As(err, &ve) || ve.Problem.Slug() != "charge-not-authorized" {
					t.Fatalf("%s of a captured charge: %v; want a charge-not-authorized ValidationError", name, err)
				}
			}
			other := charge(orderSeq.Add(1), acquirer.TokenOK)
			other.CaptureMethod = client.CaptureManual
			och, err := c.CreateCharge(context.Background(), other)
			if err != nil {
				t.Fatal(err)
			}
			canceled, err := c.Cancel(context.Background(), och.ID, "")
			if err != nil || canceled.Status != client.StatusCanceled {
				t.Fatalf("Cancel: %+v, %v", canceled, err)
			}
		})
	}
}
