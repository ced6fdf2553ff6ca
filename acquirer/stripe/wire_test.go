package stripe_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	stripego "github.com/stripe/stripe-go/v82"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/acquirer/stripe"
)

// stripeMockVersion is the stripe-mock the wire test builds from the
// module proxy when $STRIPE_MOCK names no binary and none is on PATH.
const stripeMockVersion = "v0.203.0"

// stripeMock returns the path of a stripe-mock binary: $STRIPE_MOCK, one on
// PATH, or one built with `go install` into the user's cache (kept between
// runs). It fails the test when none can be had: the wire test never skips.
func stripeMock(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("STRIPE_MOCK"); p != "" {
		return p
	}
	if p, err := exec.LookPath("stripe-mock"); err == nil {
		return p
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	gobin := filepath.Join(cache, "chargeonce", "stripe-mock-"+stripeMockVersion)
	bin := filepath.Join(gobin, "stripe-mock")
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "install", "github.com/stripe/stripe-mock@"+stripeMockVersion)
	cmd.Env = append(os.Environ(), "GOBIN="+gobin, "GOFLAGS=-buildvcs=false")
	start := time.Now()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building stripe-mock %s (set STRIPE_MOCK to a binary to skip the build): %v\n%s", stripeMockVersion, err, out)
	}
	t.Logf("built stripe-mock %s in %s", stripeMockVersion, time.Since(start).Round(time.Second))
	return bin
}

// startStripeMock runs stripe-mock on a free loopback port and returns its
// base URL once it accepts connections.
func startStripeMock(t *testing.T) string {
	t.Helper()
	bin := stripeMock(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	var out bytes.Buffer
	// -http-addr alone leaves stripe-mock's HTTPS listener on its fixed
	// default port, so a second stripe-mock (a parallel test) could not
	// bind it and exited under the first request: give it a free port too.
	cmd := exec.Command(bin, "-http-addr", addr, "-https-addr", "127.0.0.1:0")
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting stripe-mock: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	for deadline := time.Now().Add(60 * time.Second); ; {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			_ = c.Close()
			return "http://" + addr
		}
		if time.Now().After(deadline) {
			t.Fatalf("stripe-mock did not listen on %s within 60s: %v\n%s", addr, err, out.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// mockAcquirer is an adapter in front of a stripe-mock of its own, without
// stripe-go's retries.
func mockAcquirer(t *testing.T) *stripe.Acquirer {
	t.Helper()
	retries := int64(0)
	acq, err := stripe.New(stripe.Options{Key: "sk_test_123", APIBase: startStripeMock(t), MaxNetworkRetries: &retries})
	if err != nil {
		t.Fatal(err)
	}
	return acq
}

// TestWireShapeAgainstStripeMock: every request the adapter makes (create
// and confirm, search) is accepted by stripe-mock, which checks it against
// Stripe's OpenAPI description. stripe-mock is stateless, so the answers
// are fixtures: the test checks the requests, not the outcomes.
func TestWireShapeAgainstStripeMock(t *testing.T) {
	t.Parallel()
	acq := mockAcquirer(t)
	ctx := t.Context()
	for _, cur := range []string{"BRL", "USD", "JPY"} {
		ref := "ch_wire_" + cur
		res, err := acq.Capture(ctx, chargeonce.CaptureRequest{Reference: ref, OrderID: 7, Merchant: "demo", AmountCents: 1990, Currency: cur, PaymentToken: "pm_card_visa"})
		if err != nil {
			t.Fatalf("create+confirm in %s: stripe-mock refused it: %v", cur, err)
		}
		t.Logf("create+confirm %s: %+v", cur, res)
	}
	lr, err := acq.Lookup(ctx, chargeonce.LookupRequest{Reference: "ch_wire_BRL", Age: 48 * time.Hour, AgeKnown: true})
	if err != nil {
		t.Fatalf("search: stripe-mock refused it: %v", err)
	}
	t.Logf("lookup (search): %+v", lr)
}

// TestRefundWireShapeAgainstStripeMock: the refund requests (create with
// the Idempotency-Key and metadata, list a PaymentIntent's refunds,
// retrieve one) are accepted by stripe-mock. Its fixtures carry none of our
// metadata, so the test drives the requests themselves, not the finding of
// the PaymentIntent (the fake's tests do that).
func TestRefundWireShapeAgainstStripeMock(t *testing.T) {
	t.Parallel()
	acq := mockAcquirer(t)
	ctx := t.Context()
	call := chargeonce.RefundCall{Reference: "re_wire", ChargeReference: "ch_wire", Merchant: "demo", AmountCents: 500, Currency: "USD"}
	res, err := acq.RefundIntent(ctx, "pi_wire", call)
	if err != nil {
		t.Fatalf("create refund: stripe-mock refused it: %v", err)
	}
	t.Logf("create refund: %+v", res)
	lr, err := acq.RefundOn(ctx, "pi_wire", "re_wire")
	if err != nil {
		t.Fatalf("list refunds: stripe-mock refused it: %v", err)
	}
	t.Logf("list refunds: %+v", lr)
	// stripe-mock's fixture Refund carries no metadata: retrieving it must
	// be refused as another reference's, never taken as ours.
	if lr, err := acq.RefundLookup(ctx, chargeonce.LookupRequest{Reference: "re_wire", AcquirerID: "re_123"}); err == nil {
		t.Fatalf("retrieve refund: a Refund without our reference was taken: %+v", lr)
	} else {
		t.Logf("retrieve refund: %v", err)
	}
	if _, err := acq.RefundLookup(ctx, chargeonce.LookupRequest{Reference: "re_wire", ChargeReference: "ch_wire", Purpose: chargeonce.LookupToResolve}); err != nil {
		t.Fatalf("search for the refund's PaymentIntent: stripe-mock refused it: %v", err)
	}
}

// TestManualCaptureWireShapeAgainstStripeMock: the manual capture requests
// (create and confirm with capture_method manual; capture with
// amount_to_capture, metadata and the Idempotency-Key; cancel with a
// cancellation_reason; the retrieve and the search of the lookup) are
// accepted by stripe-mock, which checks them against Stripe's OpenAPI
// description. Its answers are fixtures, whatever was asked (the fake's
// tests check the outcomes): a request stripe-mock refuses fails the test
// as a 400 would.
func TestManualCaptureWireShapeAgainstStripeMock(t *testing.T) {
	t.Parallel()
	acq := mockAcquirer(t)
	ctx := t.Context()
	refused := func(what string, err error) {
		t.Helper()
		if se, ok := errors.AsType[*stripego.Error](err); ok && se.HTTPStatusCode >= 400 && se.HTTPStatusCode < 500 {
			t.Fatalf("%s: stripe-mock refused the request: %v", what, err)
		}
	}
	res, err := acq.Authorize(ctx, chargeonce.CaptureRequest{Reference: "ch_wire_auth", OrderID: 7, Merchant: "demo", AmountCents: 1990, Currency: "USD", PaymentToken: "pm_card_visa"})
	refused("create+confirm with capture_method manual", err)
	t.Logf("authorize: %+v, %v", res, err)

	call := chargeonce.OperationCall{Reference: "cp_wire", ChargeReference: "ch_wire_auth", Merchant: "demo", AmountCents: 1500, Currency: "USD"}
	op, err := acq.CaptureIntent(ctx, "pi_wire", call)
	refused("capture", err)
	t.Logf("capture: %+v, %v", op, err)
	call.Reference = "vd_wire"
	op, err = acq.VoidIntent(ctx, "pi_wire", call)
	refused("cancel", err)
	t.Logf("cancel: %+v, %v", op, err)

	// The fixture carries none of our metadata: with the charge reference
	// the lookup refuses it as another authorization's, never taking it.
	if lr, err := acq.OperationLookup(ctx, chargeonce.LookupRequest{Reference: "cp_wire", ChargeReference: "ch_wire_auth", AcquirerID: "pi_wire"}); err == nil {
		t.Fatalf("retrieve: a PaymentIntent of another reference was taken: %+v", lr)
	} else {
		refused("retrieve", err)
	}
	lr, err := acq.OperationLookup(ctx, chargeonce.LookupRequest{Reference: "cp_wire_search", Purpose: chargeonce.LookupToResolve})
	refused("search by the capture's metadata", err)
	if err != nil || lr.Status == chargeonce.LookupFound {
		t.Fatalf("search: %+v, %v; want no capture found under a reference never sent", lr, err)
	}
	t.Logf("search: %+v", lr)
}
