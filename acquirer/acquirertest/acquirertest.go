// Package acquirertest is the conformance suite every chargeonce.Acquirer
// passes, as the stores share storetest: idempotent by reference, outcome
// classes, and a lookup that never lies, also after the acquirer has
// forgotten the reference's idempotency key. It runs against the simulator,
// the HTTP client in front of it, and the Stripe adapter in front of its
// fake; its own tests run it against deliberately broken adapters and want
// it to fail each.
package acquirertest

import (
	"errors"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
)

// Harness is what the suite needs of an adapter under test.
type Harness struct {
	Acquirer chargeonce.Acquirer
	// Payment tokens: one that captures, one that is declined, and one
	// that captures but loses the answer (the outcome is unknown).
	OK, Declined, LostAnswer string
	// Captures returns how many captures moved money for reference.
	Captures func(reference string) int
	// KeyTTL is how long the acquirer behind the adapter keeps a
	// reference's idempotency key, as the harness configured it: keep it
	// short (a second or two) so that the suite can look references up
	// after the acquirer forgot them, when a re-send would move money
	// again. Zero: the acquirer never forgets.
	KeyTTL time.Duration
	// Refunds returns how many refunds moved money back for a refund
	// reference, and Refunded how much the charge reference had refunded
	// in all (minor units): the refund checks need both of an adapter
	// that refunds.
	Refunds  func(refundReference string) int
	Refunded func(chargeReference string) int64
}

// Check is one property every adapter must have.
type Check struct {
	Name string
	// Run checks it on a fresh harness, failing t when it does not hold.
	Run func(t testing.TB, h Harness)
}

// Run runs every check as a parallel subtest; newHarness returns a fresh
// adapter for each.
func Run(t *testing.T, newHarness func(t *testing.T) Harness) {
	t.Helper()
	for _, c := range Checks() {
		t.Run(c.Name, func(t *testing.T) {
			t.Parallel()
			c.Run(t, newHarness(t))
		})
	}
}

// settleWithin bounds how long a lookup may stay unsure about a reference
// whose key the acquirer has forgotten before the suite calls it stuck.
const settleWithin = 20 * time.Second

func req(ref, token string) chargeonce.CaptureRequest {
	return chargeonce.CaptureRequest{Reference: ref, OrderID: 1, Merchant: "demo", AmountCents: 1990, Currency: "BRL", PaymentToken: token}
}

// lookup asks about ref, first sent at firstSent: its age is measured here
// as the engine measures it from the database's clock.
func lookup(t testing.TB, h Harness, ref string, firstSent time.Time) chargeonce.LookupResult {
	t.Helper()
	lr, err := h.Acquirer.Lookup(t.Context(), chargeonce.LookupRequest{Reference: ref, Age: time.Since(firstSent), AgeKnown: true})
	if err != nil {
		t.Fatalf("Lookup(%s): %v", ref, err)
	}
	return lr
}

func wantUnknown(t testing.TB, res chargeonce.CaptureResult, err error) {
	t.Helper()
	if err == nil || errors.Is(err, chargeonce.ErrCaptureRejected) {
		t.Fatalf("Capture = %+v, %v; want an unknown outcome (an error that is not ErrCaptureRejected)", res, err)
	}
}

// Checks returns the suite's checks.
func Checks() []Check {
	return []Check{
		{"IdempotentByReference", func(t testing.TB, h Harness) {
			for i := range 3 {
				res, err := h.Acquirer.Capture(t.Context(), req("ch_idem", h.OK))
				if err != nil || res.Status != chargeonce.StatusCaptured || res.Reference != "ch_idem" {
					t.Fatalf("capture %d: %+v, %v; want captured", i, res, err)
				}
			}
			if n := h.Captures("ch_idem"); n != 1 {
				t.Fatalf("three sends of one reference captured %d times, want 1", n)
			}
		}},

		{"DeclinedWithACode", func(t testing.TB, h Harness) {
			res, err := h.Acquirer.Capture(t.Context(), req("ch_dec", h.Declined))
			if err != nil || res.Status != chargeonce.StatusDeclined || res.DeclineCode == "" || res.Reference != "ch_dec" {
				t.Fatalf("Capture = %+v, %v; want declined with a code", res, err)
			}
			if n := h.Captures("ch_dec"); n != 0 {
				t.Fatalf("a decline captured %d times", n)
			}
		}},

		{"LostAnswerIsUnknownAndLookupTellsTheTruth", func(t testing.TB, h Harness) {
			sent := time.Now()
			res, err := h.Acquirer.Capture(t.Context(), req("ch_lost", h.LostAnswer))
			wantUnknown(t, res, err)
			switch lr := lookup(t, h, "ch_lost", sent); lr.Status {
			case chargeonce.LookupFound:
				if lr.Result.Status != chargeonce.StatusCaptured {
					t.Fatalf("Lookup = %+v; want the capture", lr)
				}
			case chargeonce.LookupSafeToSend:
				// Safe means a re-send returns the capture, not a second one.
				res, err := h.Acquirer.Capture(t.Context(), req("ch_lost", h.LostAnswer))
				if err != nil || res.Status != chargeonce.StatusCaptured {
					t.Fatalf("the re-send a safe lookup allowed: %+v, %v; want the capture", res, err)
				}
			default:
				t.Logf("Lookup unsure: %+v", lr)
			}
			if n := h.Captures("ch_lost"); n != 1 {
				t.Fatalf("captured %d times, want 1", n)
			}
		}},

		// The acquirer forgets the key of a capture whose answer was lost;
		// recovery then asks, as it does, until the lookup decides, and
		// re-sends only when told it is safe. A lookup that calls the
		// reference "never seen" because the key is gone lets the re-send
		// capture a second time.
		{"LookupAfterTheKeyIsForgotten", func(t testing.TB, h Harness) {
			sent := time.Now()
			res, err := h.Acquirer.Capture(t.Context(), req("ch_forgot", h.LostAnswer))
			wantUnknown(t, res, err)
			time.Sleep(h.KeyTTL + 100*time.Millisecond)
			for deadline := time.Now().Add(settleWithin); ; {
				lr := lookup(t, h, "ch_forgot", sent)
				if lr.Status == chargeonce.LookupFound {
					if lr.Result.Status != chargeonce.StatusCaptured || lr.Result.Reference != "ch_forgot" {
						t.Fatalf("Lookup = %+v; want the capture", lr)
					}
					break
				}
				if lr.Status == chargeonce.LookupSafeToSend {
					res, err := h.Acquirer.Capture(t.Context(), req("ch_forgot", h.LostAnswer))
					if err != nil || res.Status != chargeonce.StatusCaptured {
						t.Fatalf("the re-send a safe lookup allowed: %+v, %v; want the capture", res, err)
					}
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the lookup is still unsure %s after the key was forgotten (%+v): the charge would stay stuck", settleWithin, lr)
				}
				time.Sleep(min(max(lr.RetryAfter, 50*time.Millisecond), 500*time.Millisecond))
			}
			if n := h.Captures("ch_forgot"); n != 1 {
				t.Fatalf("captured %d times after the key was forgotten, want 1: the lookup let a re-send move money again", n)
			}
		}},

		{"LookupNeverFindsWhatWasNeverSent", func(t testing.TB, h Harness) {
			if lr := lookup(t, h, "ch_never", time.Now()); lr.Status == chargeonce.LookupFound {
				t.Fatalf("Lookup of a reference never sent = %+v", lr)
			}
		}},

		{"LookupOfASettledCapture", func(t testing.TB, h Harness) {
			sent := time.Now()
			if _, err := h.Acquirer.Capture(t.Context(), req("ch_set", h.OK)); err != nil {
				t.Fatal(err)
			}
			lr := lookup(t, h, "ch_set", sent)
			switch lr.Status {
			case chargeonce.LookupFound:
				if lr.Result.Status != chargeonce.StatusCaptured {
					t.Fatalf("Lookup = %+v; want captured", lr)
				}
			case chargeonce.LookupSafeToSend:
				if res, err := h.Acquirer.Capture(t.Context(), req("ch_set", h.OK)); err != nil || res.Status != chargeonce.StatusCaptured {
					t.Fatalf("re-send: %+v, %v", res, err)
				}
			default:
				t.Fatalf("Lookup of a settled capture = %+v; want found or safe to send", lr)
			}
			if n := h.Captures("ch_set"); n != 1 {
				t.Fatalf("captured %d times, want 1", n)
			}
		}},
	}
}
