package e2e

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce/acquirer/stripetest"
	"github.com/chargeonce/chargeonce/internal/apitest"
	"github.com/chargeonce/chargeonce/internal/pgtest"
)

// The money-safety storms against the fake Stripe (acquirer/stripetest):
// real serve processes with --acquirer stripe, the secret key in
// STRIPE_SECRET_KEY, the fake's API on loopback. Each storm counts what the
// fake holds: one PaymentIntent per intent, succeeded, never two.

// stormKey is the secret key the fake accepts.
const stormKey = "sk_test_e2e_storm"

// startStripeFake serves a fake Stripe on loopback and returns its URL.
func startStripeFake(t *testing.T, opts stripetest.Options) (*stripetest.Fake, string) {
	t.Helper()
	opts.Key = stormKey
	fake := stripetest.New(opts)
	srv := httptest.NewServer(fake)
	t.Cleanup(srv.Close)
	return fake, srv.URL
}

// startStripeServe starts a serve process on db with --acquirer stripe
// against the API at apiBase, its key in the environment.
func (ps *procs) startStripeServe(name, db, apiBase string, extra ...string) *proc {
	ps.t.Helper()
	args := serveArgs(db, "stripe", append([]string{"--stripe-api-base", apiBase}, extra...)...)
	return ps.startEnv(name, []string{"STRIPE_SECRET_KEY=" + stormKey}, args...)
}

// stormIntent is one intent of a storm: its key and body, what its first
// attempt answered, and its final answer.
type stormIntent struct {
	key   string
	pm    string
	body  []byte
	first answer
	final answer
	id    string // the charge's ID: its reference at Stripe
}

// newStormIntents returns perKind intents of each payment method.
func newStormIntents(perKind int, pms ...string) []*stormIntent {
	var out []*stormIntent
	for i := range perKind {
		for _, pm := range pms {
			out = append(out, &stormIntent{key: uniqueName(fmt.Sprintf("storm-%s-%d-", pm, i)), pm: pm, body: chargeBody(newOrder(), pm)})
		}
	}
	return out
}

// firstAttempts sends every intent's first attempt at once, to base(i) for
// the i-th intent, and waits for the answers.
func firstAttempts(intents []*stormIntent, base func(i int) string) {
	var wg sync.WaitGroup
	c := &http.Client{Timeout: 30 * time.Second}
	for i, in := range intents {
		wg.Go(func() { in.first = charge(c, base(i), in.key, in.body) })
	}
	wg.Wait()
}

// firstStatuses counts the first answers by status ("error" for none).
func firstStatuses(intents []*stormIntent) map[string]int {
	out := map[string]int{}
	for _, in := range intents {
		out[statuses([]answer{in.first})[0]]++
	}
	return out
}

// settleAll retries every intent at once, on the instances in turn, until
// each has a final answer, which must be 201 captured; then every instance
// replays it.
func settleAll(t *testing.T, within time.Duration, bases func() []string, intents []*stormIntent) {
	t.Helper()
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []string
	)
	for _, in := range intents {
		wg.Go(func() {
			if err := settle(within, bases, in); err != nil {
				mu.Lock()
				errs = append(errs, err.Error())
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d of %d intents did not settle captured:\n%s", len(errs), len(intents), strings.Join(errs, "\n"))
	}
	for _, in := range intents {
		wantReplays(t, bases(), in.key, in.body, in.final)
	}
}

// settle is untilFinal for a goroutine: it returns what went wrong instead
// of failing the test.
func settle(within time.Duration, bases func() []string, in *stormIntent) error {
	c := &http.Client{Timeout: 10 * time.Second}
	deadline := time.Now().Add(within)
	var trail []answer
	for i := 0; ; i++ {
		bs := bases()
		a := charge(c, bs[i%len(bs)], in.key, in.body)
		if a.final() {
			var ch chargeObject
			if err := json.Unmarshal(a.body, &ch); err != nil || a.status != 201 || ch.Status != "captured" {
				return fmt.Errorf("%s (%s): final answer %s; want 201 captured", in.key, in.pm, a)
			}
			in.final, in.id = a, ch.ID
			return nil
		}
		if a.err == nil && a.status != 202 && a.status != 409 && a.status < 500 {
			return fmt.Errorf("%s (%s): unexpected answer %s after %v", in.key, in.pm, a, statuses(trail))
		}
		trail = append(trail, a)
		if time.Now().After(deadline) {
			return fmt.Errorf("%s (%s): no final answer within %s: %v", in.key, in.pm, within, statuses(trail))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// createRequests counts the create requests the fake received.
func createRequests(fake *stripetest.Fake) (creates, searches int) {
	for _, r := range fake.Requests() {
		switch r.Path {
		case "/v1/payment_intents":
			creates++
		case "/v1/payment_intents/search":
			searches++
		}
	}
	return creates, searches
}

// stormReport logs what the fake holds and wants exactly one PaymentIntent
// per intent, succeeded, under the intent's charge reference, and none
// under any other.
func stormReport(t *testing.T, fake *stripetest.Fake, intents []*stormIntent, extra string) {
	t.Helper()
	pis := fake.Intents()
	perRef := map[string][]stripetest.PaymentIntent{}
	succeeded := 0
	for _, pi := range pis {
		ref := pi.Metadata["chargeonce_reference"]
		perRef[ref] = append(perRef[ref], pi)
		if pi.Status == "succeeded" {
			succeeded++
		}
	}
	dups := fake.Duplicates()
	creates, searches := createRequests(fake)
	t.Logf("intents %d, PaymentIntents created %d, succeeded %d, duplicates %d; create requests %d, searches %d; first answers %v%s",
		len(intents), len(pis), succeeded, len(dups), creates, searches, firstStatuses(intents), extra)
	if len(dups) != 0 {
		t.Errorf("references with more than one PaymentIntent (a double charge): %v", dups)
		// What Stripe saw of them, to tell who sent the second one.
		var t0 time.Time
		for _, r := range fake.Requests() {
			if t0.IsZero() {
				t0 = r.At
			}
			if ref := r.Form.Get("metadata[chargeonce_reference]"); slices.Contains(dups, ref) {
				t.Logf("%s: POST %s (Idempotency-Key %q) at +%s", ref, r.Path, r.IdempotencyKey, r.At.Sub(t0).Round(time.Millisecond))
			}
		}
	}
	for _, in := range intents {
		if list := perRef[in.id]; len(list) != 1 || list[0].Status != "succeeded" {
			t.Errorf("%s (%s): charge %s has PaymentIntents %+v; want one, succeeded", in.key, in.pm, in.id, list)
		}
	}
	if len(pis) != len(intents) {
		t.Errorf("%d PaymentIntents for %d intents", len(pis), len(intents))
	}
}

// TestStripeStormKilledMidCapture: instance A takes 24 intents and is
// SIGKILLed while Stripe is still working on their PaymentIntents (pm_slow
// holds each request 4 s). The PaymentIntents are made all the same. The
// clients retry on B and C, whose recovery and retries take the records
// over when A's leases end and settle each from the PaymentIntent A's
// request made: one PaymentIntent per intent.
func TestStripeStormKilledMidCapture(t *testing.T) {
	t.Parallel()
	const n = 24
	url := pgtest.URL(t)
	fake, api := startStripeFake(t, stripetest.Options{Slow: 4 * time.Second})
	ps := newProcs(t)
	// The acquirer timeout outlives the slow request, and the lease the
	// timeout: the kill, not a timeout, leaves the records behind.
	flags := []string{"--lease", "8s", "--acquirer-timeout", "6s", "--reconcile-every", "200ms"}
	dbURL := withParams(url, "pool_max_conns", "4")
	a := ps.startStripeServe("serve-a", dbURL, api, flags...)
	b := ps.startStripeServe("serve-b", dbURL, api, flags...)
	c := ps.startStripeServe("serve-c", dbURL, api, flags...)

	intents := newStormIntents(n, stripetest.PMSlow)
	done := make(chan struct{})
	go func() {
		defer close(done)
		firstAttempts(intents, func(int) string { return a.URL() })
	}()
	apitest.Eventually(t, 30*time.Second, "every capture request to reach Stripe", func() bool {
		creates, _ := createRequests(fake)
		return creates >= n
	})
	a.kill()
	start := time.Now()
	inFlight := n - len(fake.Intents())
	<-done
	if inFlight < n/2 {
		t.Fatalf("only %d of %d captures were in flight at Stripe when A was killed: the kill did not land mid-capture", inFlight, n)
	}
	for _, in := range intents {
		if in.first.err == nil && in.first.status != 201 {
			t.Fatalf("%s: the killed instance answered %s", in.key, in.first)
		}
	}

	settleAll(t, 90*time.Second, func() []string { return []string{b.URL(), c.URL()} }, intents)
	stormReport(t, fake, intents, fmt.Sprintf("; A killed with %d of %d captures in flight at Stripe, all settled %s after", inFlight, n, time.Since(start).Round(time.Millisecond)))
}

// TestStripeStormLostAnswers: 30 intents whose first answers are lost on
// two instances: Stripe commits the PaymentIntent, then answers 500
// (pm_fail_after) or cuts the connection (pm_drop_after); or it fails
// before committing (500, 503 and 429, the last two with Retry-After). The
// faults outlast stripe-go's own retries (they strike every request for a
// reference within 3 s of its first, one acquirer timeout), so the service
// sees unknown outcomes; clients retry on either instance and recovery
// runs on both, until each intent has one PaymentIntent.
func TestStripeStormLostAnswers(t *testing.T) {
	t.Parallel()
	const perKind = 6
	url := pgtest.URL(t)
	fake, api := startStripeFake(t, stripetest.Options{FaultFor: 3 * time.Second, RetryAfter: time.Second})
	ps := newProcs(t)
	flags := []string{"--lease", "4s", "--acquirer-timeout", "3s", "--reconcile-every", "200ms"}
	dbURL := withParams(url, "pool_max_conns", "4")
	a := ps.startStripeServe("serve-a", dbURL, api, flags...)
	b := ps.startStripeServe("serve-b", dbURL, api, flags...)
	bases := func() []string { return []string{a.URL(), b.URL()} }

	intents := newStormIntents(perKind, stripetest.PMFailAfter, stripetest.PMDropAfter, stripetest.PMFailBefore, stripetest.PMUnavailable, stripetest.PMRateLimited)
	start := time.Now()
	firstAttempts(intents, func(i int) string { return bases()[i%2] })
	unknown := 0
	for _, in := range intents {
		switch {
		case in.first.err == nil && in.first.status == 202:
			unknown++
		case in.first.err == nil && in.first.status == 201:
			// A transport's own re-send got the key's replay.
		default:
			t.Fatalf("%s (%s): first answer %s; want 202 (outcome unknown)", in.key, in.pm, in.first)
		}
	}
	if unknown < len(intents)/2 {
		t.Fatalf("only %d of %d first answers were unknown outcomes: the faults did not outlast stripe-go's retries", unknown, len(intents))
	}

	settleAll(t, 90*time.Second, bases, intents)
	stormReport(t, fake, intents, fmt.Sprintf("; settled %s after the first attempts", time.Since(start).Round(time.Millisecond)))
}

// TestStripeStormKeyExpiredBeforeRecovery: 24 intents whose first answers
// are lost on instance A (PaymentIntents committed, or not; the faults
// last one acquirer timeout, A's retries included), which is then
// killed. Stripe forgets every key (the fake keeps them 3 s) before
// instance B starts, so a re-send would make a second PaymentIntent. B's
// lookups go through the search, which lags 10 s behind a new
// PaymentIntent, so B's first searches miss every PaymentIntent: B stays
// unsure while a miss may be the lag (--stripe-search-lag 12s), settles
// from the PaymentIntents once the search shows them, and sends again only
// the references Stripe never saw. A lookup that trusted the first miss
// would charge every committed intent twice.
//
// The time scale is shrunk, but the proportions are Stripe's: the adapter
// trusts a key (--stripe-key-window) for less than Stripe keeps it by more
// than one call lasts (--acquirer-timeout), since stripe-go's own retries
// within a call re-send the key. With the fake keeping keys 1 s, a window
// of 800 ms and a 3 s timeout, stripe-go's second retry came after the key
// was gone, and the storm counted 3 double charges.
func TestStripeStormKeyExpiredBeforeRecovery(t *testing.T) {
	t.Parallel()
	const (
		perKind = 8
		keyTTL  = 3 * time.Second
	)
	url := pgtest.URL(t)
	fake, api := startStripeFake(t, stripetest.Options{KeyTTL: keyTTL, SearchLag: 10 * time.Second, FaultFor: 1500 * time.Millisecond})
	ps := newProcs(t)
	stripeFlags := []string{"--lease", "2s", "--acquirer-timeout", "1500ms", "--stripe-key-window", "1s", "--stripe-search-lag", "12s"}
	dbURL := withParams(url, "pool_max_conns", "4")
	// A's recovery does not come round again: only B recovers.
	a := ps.startStripeServe("serve-a", dbURL, api, append(stripeFlags, "--reconcile-every", "1h")...)

	intents := newStormIntents(perKind, stripetest.PMFailAfter, stripetest.PMDropAfter, stripetest.PMFailBefore)
	firstAttempts(intents, func(int) string { return a.URL() })
	lastFirst := time.Now()
	a.kill()
	for _, in := range intents {
		if in.first.err != nil || (in.first.status != 202 && in.first.status != 201) {
			t.Fatalf("%s (%s): first answer %s; want 202 (outcome unknown)", in.key, in.pm, in.first)
		}
	}
	committed := map[string]bool{}
	for _, pi := range fake.Intents() {
		committed[pi.Metadata["chargeonce_reference"]] = true
	}

	time.Sleep(time.Until(lastFirst.Add(keyTTL + 200*time.Millisecond))) // Stripe forgets every key
	before := len(fake.Requests())
	b := ps.startStripeServe("serve-b", dbURL, api, append(stripeFlags, "--reconcile-every", "200ms")...)
	start := time.Now()
	settleAll(t, 90*time.Second, func() []string { return []string{b.URL()} }, intents)

	// B sent again exactly the references Stripe held no PaymentIntent for.
	resent := map[string]bool{}
	for _, r := range fake.Requests()[before:] {
		if r.Path == "/v1/payment_intents" {
			resent[r.Form.Get("metadata[chargeonce_reference]")] = true
		}
	}
	var want []string
	for _, in := range intents {
		if !committed[in.id] {
			want = append(want, in.id)
		}
	}
	slices.Sort(want)
	got := slices.Sorted(maps.Keys(resent))
	// Searches for a committed reference beyond the one that found it
	// missed a PaymentIntent the search did not show yet.
	misses := -len(committed)
	for _, r := range fake.Requests()[before:] {
		if q := r.Form.Get("query"); r.Path == "/v1/payment_intents/search" {
			for ref := range committed {
				if strings.Contains(q, ref) {
					misses++
				}
			}
		}
	}
	stormReport(t, fake, intents, fmt.Sprintf("; after the keys expired: %d PaymentIntents found (after %d searches that missed them: lag), %d references sent again, all settled %s after B started",
		len(committed), misses, len(got), time.Since(start).Round(time.Millisecond)))
	if !slices.Equal(got, want) {
		t.Errorf("after the keys expired B sent %v; want exactly the references without a PaymentIntent, %v", got, want)
	}
}
