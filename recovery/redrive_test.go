package recovery_test

import (
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/recovery"
)

// forgetfulAcquirer is a simulator that forgets references after window,
// reached in-process or over HTTP through acquirer.Client.
func forgetfulAcquirer(t *testing.T, window time.Duration, overHTTP bool) (*acquirer.Simulator, chargeonce.Acquirer) {
	t.Helper()
	sim := acquirer.NewSimulator(acquirer.Options{IdempotencyWindow: window})
	t.Cleanup(func() { sim.Close() })
	if !overHTTP {
		return sim, sim
	}
	srv := httptest.NewServer(acquirer.Handler(sim))
	t.Cleanup(srv.Close)
	return sim, acquirer.NewClient(srv.URL, nil)
}

// TestRedriveLooksUpBeforeResending is issue 9's fourth case: the acquirer
// keeps a reference for an idempotency window only (300ms here). The first
// attempt's capture of tok_fail_after goes through but its reply is lost
// (202); whoever re-drives the record after the window — recovery, or the
// client's retry that takes over the expired lease — must not send the
// reference again, which would capture a second time: it looks the
// reference up and settles from the capture it finds.
func TestRedriveLooksUpBeforeResending(t *testing.T) {
	t.Parallel()
	const window = 300 * time.Millisecond
	for _, tc := range []struct {
		name     string
		overHTTP bool
		byRetry  bool
	}{
		{"recovery/in-process", false, false},
		{"recovery/http", true, false},
		{"retry/in-process", false, true},
		{"retry/http", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			sim, acq := forgetfulAcquirer(t, window, tc.overHTTP)
			// The unknown outcome backs the record off; a short back-off
			// ends well within the window the test waits out.
			e := setup(t, nil, engine.Options{BackoffBase: 50 * time.Millisecond, BackoffMax: 50 * time.Millisecond})
			eng := engine.New(e.store, acq, e.eng.Options())
			req := request(acquirer.TokenFailAfter)

			first, err := eng.Charge(t.Context(), "demo", "k", req)
			if err != nil || first.Status != 202 {
				t.Fatalf("first attempt: %d %s, %v; want 202 (captured, reply lost)", first.Status, first.Body, err)
			}
			time.Sleep(window + 100*time.Millisecond) // the acquirer forgets the reference

			if tc.byRetry {
				// The record's back-off is over: the retry takes it
				// over and re-drives it.
				final, err := eng.Charge(t.Context(), "demo", "k", req)
				if err != nil || final.Status != 201 {
					t.Fatalf("retry: %d %s, %v; want 201", final.Status, final.Body, err)
				}
			} else {
				res, err := recovery.NewRescuer(e.store, eng, recovery.RescuerOptions{}).RunOnce(t.Context())
				if err != nil || res.Settled != 1 {
					t.Fatalf("RunOnce = %+v, %v; want the record settled", res, err)
				}
				wantReplay(t, &env{store: e.store, eng: eng}, "k", req, 201)
			}
			st := sim.Stats()
			t.Logf("captures for the intent: %d (acquirer %+v)", sim.CapturedCount("demo", req.OrderID), st)
			if n := sim.CapturedCount("demo", req.OrderID); n != 1 {
				t.Fatalf("the intent was captured %d times, want exactly 1", n)
			}
			if st.CaptureRequests != 1 {
				t.Fatalf("acquirer got %d capture requests, want 1: the re-drive must settle from the lookup", st.CaptureRequests)
			}
		})
	}
}

// TestRedriveSendsWhatTheAcquirerNeverSaw: a lookup that finds nothing (404:
// tok_fail_before captured nothing) is the one case where the reference is
// sent again, and that capture settles the intent once.
func TestRedriveSendsWhatTheAcquirerNeverSaw(t *testing.T) {
	t.Parallel()
	sim, acq := forgetfulAcquirer(t, 300*time.Millisecond, true)
	e := setup(t, nil, engine.Options{BackoffBase: 50 * time.Millisecond, BackoffMax: 50 * time.Millisecond})
	eng := engine.New(e.store, acq, e.eng.Options())
	req := request(acquirer.TokenFailBefore)
	if first, err := eng.Charge(t.Context(), "demo", "k", req); err != nil || first.Status != 202 {
		t.Fatalf("first attempt: %d %s, %v; want 202", first.Status, first.Body, err)
	}
	time.Sleep(100 * time.Millisecond) // the record's back-off ends
	res, err := recovery.NewRescuer(e.store, eng, recovery.RescuerOptions{}).RunOnce(t.Context())
	if err != nil || res.Settled != 1 {
		t.Fatalf("RunOnce = %+v, %v; want the record settled", res, err)
	}
	wantReplay(t, &env{store: e.store, eng: eng}, "k", req, 201)
	if n, st := sim.CapturedCount("demo", req.OrderID), sim.Stats(); n != 1 || st.CaptureRequests != 2 {
		t.Fatalf("captured %d times with %d requests (%+v); want 1 capture, from the second request", n, st.CaptureRequests, st)
	}
}

// TestRecoveryNeverResendsOnABare404: a lookup that meets something other
// than the acquirer — a proxy or load balancer answering a bare 404, say
// while the acquirer's host is being replaced — has not learnt that the
// acquirer never saw the reference. Recovery must not send it again: here
// the acquirer forgot the reference (its window ended) after capturing it
// with the reply lost, so a re-send would capture twice.
func TestRecoveryNeverResendsOnABare404(t *testing.T) {
	t.Parallel()
	const window = 200 * time.Millisecond
	sim := acquirer.NewSimulator(acquirer.Options{IdempotencyWindow: window})
	t.Cleanup(func() { sim.Close() })
	api := acquirer.Handler(sim)
	var bare atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if bare.Load() && r.Method == http.MethodGet {
			http.NotFound(w, r) // text/plain "404 page not found"
			return
		}
		api.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	e := setup(t, nil, engine.Options{BackoffBase: 50 * time.Millisecond, BackoffMax: 50 * time.Millisecond})
	eng := engine.New(e.store, acquirer.NewClient(srv.URL, nil), e.eng.Options())
	req := request(acquirer.TokenFailAfter)
	fast := recovery.RescuerOptions{BackoffBase: 50 * time.Millisecond, BackoffMax: 50 * time.Millisecond}
	if first, err := eng.Charge(t.Context(), "demo", "k", req); err != nil || first.Status != 202 {
		t.Fatalf("first attempt: %d %s, %v; want 202 (captured, reply lost)", first.Status, first.Body, err)
	}
	time.Sleep(window + 100*time.Millisecond) // the acquirer forgets the reference
	bare.Store(true)
	res, err := recovery.NewRescuer(e.store, eng, fast).RunOnce(t.Context())
	if err != nil {
		t.Fatalf("RunOnce: %v", err)
	}
	t.Logf("pass %+v; acquirer %+v", res, sim.Stats())
	if n := sim.CapturedCount("demo", req.OrderID); n != 1 {
		t.Fatalf("the intent was captured %d times, want 1: a bare 404 is not the acquirer saying it never saw the reference", n)
	}
	// Every claim is deferred. With a 50 ms back-off a loaded machine's
	// pass may claim the record twice (its back-off ended while the first
	// lookup ran: seen on a cold CI run, Claimed 2, Deferred 2), never
	// settling or re-sending it.
	if res.Settled != 0 || res.Deferred < 1 || res.Deferred != res.Claimed {
		t.Fatalf("RunOnce = %+v; want the record deferred while the lookup cannot be trusted", res)
	}

	bare.Store(false) // the acquirer answers again: recovery settles from its capture
	time.Sleep(100 * time.Millisecond)
	if res, err := recovery.NewRescuer(e.store, eng, fast).RunOnce(t.Context()); err != nil || res.Settled != 1 {
		t.Fatalf("RunOnce after the proxy recovered = %+v, %v; want the record settled", res, err)
	}
	wantReplay(t, &env{store: e.store, eng: eng}, "k", req, 201)
	if n := sim.CapturedCount("demo", req.OrderID); n != 1 {
		t.Fatalf("the intent was captured %d times, want 1", n)
	}
}
