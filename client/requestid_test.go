package client_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/client"
	"github.com/chargeonce/chargeonce/engine"
)

// TestErrorsCarryTheRequestID: an error answer's Request-Id reaches the
// caller on the APIError (as stripe-go's errors carry theirs) and in its
// message, so a merchant can quote it to the operators.
func TestErrorsCarryTheRequestID(t *testing.T) {
	t.Parallel()
	f := setup(t, "sqlite", engine.Options{}, acquirer.Options{})
	bad := client.New(f.inst.URL, "sk_test_nope", fastRetries)
	t.Cleanup(bad.CloseIdleConnections)
	_, err := bad.CreateCharge(context.Background(), charge(orderSeq.Add(1), "tok_ok"))
	var ae *client.APIError
	if !errors.As(err, &ae) || ae.StatusCode != 401 {
		t.Fatalf("err = %v, want a 401", err)
	}
	if !strings.HasPrefix(ae.RequestID, "req_") || ae.Problem.RequestID != ae.RequestID || !strings.Contains(err.Error(), ae.RequestID) {
		t.Fatalf("401: RequestID %q, problem's %q, message %q; want the answer's req_ id in all three", ae.RequestID, ae.Problem.RequestID, err)
	}

	// A decline is a stored answer: its body has no request id, the
	// header does, and differs between the first answer and the replay.
	c := newClient(t, f.inst.URL)
	req := charge(orderSeq.Add(1), acquirer.TokenDeclined)
	req.IdempotencyKey = client.NewIdempotencyKey()
	_, err1 := c.CreateCharge(context.Background(), req)
	_, err2 := c.CreateCharge(context.Background(), req)
	var d1, d2 *client.DeclinedError
	if !errors.As(err1, &d1) || !errors.As(err2, &d2) {
		t.Fatalf("errors %v, %v; want two declines", err1, err2)
	}
	if !strings.HasPrefix(d1.RequestID, "req_") || !strings.HasPrefix(d2.RequestID, "req_") || d1.RequestID == d2.RequestID || d1.Problem.RequestID != "" {
		t.Fatalf("declines: RequestIDs %q and %q (problem's %q); want two different ids from the header, none in the stored body", d1.RequestID, d2.RequestID, d1.Problem.RequestID)
	}
}
