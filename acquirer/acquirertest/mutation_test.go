package acquirertest_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/acquirer/acquirertest"
)

// recorder is the testing.TB a check runs on in TestSuiteFailsBrokenAdapters:
// it records failures instead of failing the test, and ends the check's
// goroutine on Fatal as testing does. Everything else (Context, Cleanup,
// Logf) goes to the real subtest.
type recorder struct {
	testing.TB
	mu   sync.Mutex
	msgs []string
}

func (r *recorder) fail(msg string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, msg)
}

func (r *recorder) Helper()                   {}
func (r *recorder) Fail()                     { r.fail("Fail called") }
func (r *recorder) Error(args ...any)         { r.fail(fmt.Sprint(args...)) }
func (r *recorder) Errorf(f string, a ...any) { r.fail(fmt.Sprintf(f, a...)) }

// The fatal ones end the check's goroutine, as testing does.
func (r *recorder) FailNow()                  { r.stop("FailNow called") }
func (r *recorder) Fatal(args ...any)         { r.stop(fmt.Sprint(args...)) }
func (r *recorder) Fatalf(f string, a ...any) { r.stop(fmt.Sprintf(f, a...)) }

// A check that skips proves nothing: it counts as a failure.
func (r *recorder) Skip(args ...any)         { r.stop("skipped: " + fmt.Sprint(args...)) }
func (r *recorder) Skipf(f string, a ...any) { r.stop("skipped: " + fmt.Sprintf(f, a...)) }
func (r *recorder) SkipNow()                 { r.stop("skipped") }

func (r *recorder) stop(msg string) {
	r.fail(msg)
	runtime.Goexit()
}

func (r *recorder) Failed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.msgs) > 0
}

func (r *recorder) failures() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.msgs)
}

// suiteFailures runs every check of the suite, each on a fresh harness and
// a recorder, and returns the failures of each check that failed.
func suiteFailures(t *testing.T, newHarness func(t *testing.T) acquirertest.Harness) map[string][]string {
	t.Helper()
	var (
		mu  sync.Mutex
		out = map[string][]string{}
		wg  sync.WaitGroup
	)
	for _, c := range append(acquirertest.Checks(), acquirertest.RefundChecks()...) {
		h := newHarness(t)
		wg.Go(func() {
			rec := &recorder{TB: t}
			done := make(chan struct{})
			go func() {
				defer close(done)
				c.Run(rec, h)
			}()
			<-done
			if msgs := rec.failures(); len(msgs) > 0 {
				mu.Lock()
				out[c.Name] = msgs
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return out
}

// lyingLookup calls every reference "safe to send" once it has no record
// of it: the adapter that forgets that its acquirer forgets keys.
type lyingLookup struct{ chargeonce.Acquirer }

func (lyingLookup) Lookup(context.Context, chargeonce.LookupRequest) (chargeonce.LookupResult, error) {
	return chargeonce.LookupResult{Status: chargeonce.LookupSafeToSend, Reason: "never seen"}, nil
}

// freshReference sends every capture under a new reference, so the
// acquirer cannot recognise a repeat: not idempotent by reference.
type freshReference struct {
	chargeonce.Acquirer
	n atomic.Int64
}

func (a *freshReference) Capture(ctx context.Context, req chargeonce.CaptureRequest) (chargeonce.CaptureResult, error) {
	ref := req.Reference
	req.Reference = fmt.Sprintf("%s.%d", ref, a.n.Add(1))
	res, err := a.Acquirer.Capture(ctx, req)
	res.Reference = ref
	return res, err
}

// prefixCaptures counts the captures of every reference freshReference
// made of ref.
func prefixCaptures(h acquirertest.Harness) func(string) int {
	return func(ref string) int {
		n := 0
		for i := range 10 {
			n += h.Captures(fmt.Sprintf("%s.%d", ref, i))
		}
		return n
	}
}

// unknownAsRejected calls an unknown outcome a definite refusal: the
// charge would settle declined while the money may have moved.
type unknownAsRejected struct{ chargeonce.Acquirer }

func (a unknownAsRejected) Capture(ctx context.Context, req chargeonce.CaptureRequest) (chargeonce.CaptureResult, error) {
	res, err := a.Acquirer.Capture(ctx, req)
	if err != nil && !errors.Is(err, chargeonce.ErrCaptureRejected) {
		return res, fmt.Errorf("%w: %w", chargeonce.ErrCaptureRejected, err)
	}
	return res, err
}

// declineAsRejected answers a decline with ErrCaptureRejected: the card
// network's decline code is lost.
type declineAsRejected struct{ chargeonce.Acquirer }

func (a declineAsRejected) Capture(ctx context.Context, req chargeonce.CaptureRequest) (chargeonce.CaptureResult, error) {
	res, err := a.Acquirer.Capture(ctx, req)
	if err == nil && res.Status == chargeonce.StatusDeclined {
		return chargeonce.CaptureResult{}, fmt.Errorf("%w: declined %s", chargeonce.ErrCaptureRejected, res.DeclineCode)
	}
	return res, err
}

// lyingRefundLookup calls every refund reference "safe to send": the
// adapter that trusts the key window alone after its acquirer forgot it.
type lyingRefundLookup struct{ chargeonce.Acquirer }

func (a lyingRefundLookup) Refund(ctx context.Context, req chargeonce.RefundCall) (chargeonce.RefundResult, error) {
	return a.Acquirer.(chargeonce.Refunder).Refund(ctx, req)
}

func (lyingRefundLookup) RefundLookup(context.Context, chargeonce.LookupRequest) (chargeonce.LookupResult, error) {
	return chargeonce.LookupResult{Status: chargeonce.LookupSafeToSend, Reason: "never seen"}, nil
}

// refundUnknownAsRejected calls a refund's unknown outcome a refusal: the
// refund would settle failed while the money went back.
type refundUnknownAsRejected struct{ chargeonce.Acquirer }

func (a refundUnknownAsRejected) Refund(ctx context.Context, req chargeonce.RefundCall) (chargeonce.RefundResult, error) {
	res, err := a.Acquirer.(chargeonce.Refunder).Refund(ctx, req)
	if err != nil && !errors.Is(err, chargeonce.ErrCaptureRejected) {
		return res, fmt.Errorf("%w: %w", chargeonce.ErrCaptureRejected, err)
	}
	return res, err
}

func (a refundUnknownAsRejected) RefundLookup(ctx context.Context, req chargeonce.LookupRequest) (chargeonce.LookupResult, error) {
	return a.Acquirer.(chargeonce.Refunder).RefundLookup(ctx, req)
}

// freshKeys replaces the Idempotency-Key of every request with a new one:
// the Stripe adapter, unchanged, made not idempotent on the wire.
type freshKeys struct{}

func (freshKeys) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Header.Get("Idempotency-Key") != "" {
		r = r.Clone(r.Context())
		r.Header.Set("Idempotency-Key", rand.Text())
	}
	return http.DefaultTransport.RoundTrip(r)
}

// TestSuiteFailsBrokenAdapters: the suite must catch adapters that would
// move money twice or settle a charge wrongly. Each mutant (the simulator's
// or the Stripe adapter, with one thing broken) runs the whole suite on a
// recorder, and the check named must fail; the unbroken adapters pass every
// check on the same recorder, so a recorder that fails everything cannot
// pass this test.
func TestSuiteFailsBrokenAdapters(t *testing.T) {
	t.Parallel()
	sim := func(wrap func(h acquirertest.Harness) acquirertest.Harness) func(t *testing.T) acquirertest.Harness {
		return func(t *testing.T) acquirertest.Harness { return wrap(simHarness(t, false)) }
	}
	stripeWith := func(rt http.RoundTripper, wrap func(h acquirertest.Harness) acquirertest.Harness) func(t *testing.T) acquirertest.Harness {
		return func(t *testing.T) acquirertest.Harness { return wrap(stripeHarness(t, rt)) }
	}
	same := func(h acquirertest.Harness) acquirertest.Harness { return h }
	for _, m := range []struct {
		name     string
		harness  func(t *testing.T) acquirertest.Harness
		caughtBy string // "": the unbroken adapter, which must pass every check
	}{
		{"sim/unbroken", sim(same), ""},
		{"stripe/unbroken", stripeWith(nil, same), ""},
		{"sim/lookup-never-seen-after-the-key-is-forgotten", sim(func(h acquirertest.Harness) acquirertest.Harness {
			h.Acquirer = lyingLookup{h.Acquirer}
			return h
		}), "LookupAfterTheKeyIsForgotten"},
		{"stripe/lookup-skips-the-search", stripeWith(nil, func(h acquirertest.Harness) acquirertest.Harness {
			h.Acquirer = lyingLookup{h.Acquirer}
			return h
		}), "LookupAfterTheKeyIsForgotten"},
		{"sim/capture-not-idempotent-by-reference", sim(func(h acquirertest.Harness) acquirertest.Harness {
			h.Captures = prefixCaptures(h)
			h.Acquirer = &freshReference{Acquirer: h.Acquirer}
			return h
		}), "IdempotentByReference"},
		{"stripe/capture-with-a-fresh-idempotency-key", stripeWith(freshKeys{}, same), "IdempotentByReference"},
		{"sim/unknown-outcome-as-rejected", sim(func(h acquirertest.Harness) acquirertest.Harness {
			h.Acquirer = unknownAsRejected{h.Acquirer}
			return h
		}), "LostAnswerIsUnknownAndLookupTellsTheTruth"},
		{"stripe/unknown-outcome-as-rejected", stripeWith(nil, func(h acquirertest.Harness) acquirertest.Harness {
			h.Acquirer = unknownAsRejected{h.Acquirer}
			return h
		}), "LostAnswerIsUnknownAndLookupTellsTheTruth"},
		{"stripe/refund-lookup-skips-the-list", stripeWith(nil, func(h acquirertest.Harness) acquirertest.Harness {
			h.Acquirer = lyingRefundLookup{h.Acquirer}
			return h
		}), "RefundLookupAfterTheKeyIsForgotten"},
		{"stripe/refund-with-a-fresh-idempotency-key", stripeWith(freshKeys{}, same), "RefundIdempotentByReference"},
		{"sim/refund-unknown-outcome-as-rejected", sim(func(h acquirertest.Harness) acquirertest.Harness {
			h.Acquirer = refundUnknownAsRejected{h.Acquirer}
			return h
		}), "RefundLostAnswerIsUnknownAndLookupTellsTheTruth"},
		{"stripe/decline-as-rejected", stripeWith(nil, func(h acquirertest.Harness) acquirertest.Harness {
			h.Acquirer = declineAsRejected{h.Acquirer}
			return h
		}), "DeclinedWithACode"},
	} {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			failed := suiteFailures(t, m.harness)
			names := make([]string, 0, len(failed))
			for name, msgs := range failed {
				names = append(names, name)
				t.Logf("%s failed: %s", name, strings.Join(msgs, "; "))
			}
			slices.Sort(names)
			switch {
			case m.caughtBy == "" && len(failed) > 0:
				t.Errorf("the unbroken adapter failed %v", names)
			case m.caughtBy != "" && failed[m.caughtBy] == nil:
				t.Errorf("the suite did not catch the broken adapter in %s (failed: %v)", m.caughtBy, names)
			case m.caughtBy == "":
				t.Logf("passed every check")
			default:
				t.Logf("caught by %v", names)
			}
		})
	}
}
