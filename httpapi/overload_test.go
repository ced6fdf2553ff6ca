package httpapi_test

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/idempotency"
	"github.com/chargeonce/chargeonce/internal/apitest"
	"github.com/chargeonce/chargeonce/wire"
)

// retryAfter returns r's Retry-After in whole seconds, failing the test
// when it is missing or not a positive integer.
func retryAfter(t *testing.T, r apitest.Result) int {
	t.Helper()
	v := r.Header.Get("Retry-After")
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("%d answer has Retry-After %q; want a whole number of seconds, at least 1", r.Status, v)
	}
	return n
}

// quantile returns the q-quantile of ds (nearest rank).
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))]
}

// TestCheapAnswersNeverWaitForAcquirerSlots is a retry storm at a slow
// acquirer (10 s): 120 new charges of one merchant at once take every
// acquirer slot that merchant may hold, 56 of the default 64 (the rest wait
// for one, and are refused with 429 for the merchant's share), and then come what
// needs no acquirer: replays, 422s, a retry of an in-flight key (409) and
// GETs. Each must be answered while every slot is still busy, not after one
// frees up.
func TestCheapAnswersNeverWaitForAcquirerSlots(t *testing.T) {
	t.Parallel()
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			const (
				slots = engine.DefaultMaxInFlight * 7 / 8 // engine.MerchantSlots
				burst = 120
				slow  = 10 * time.Second
			)
			store := apitest.Store(t, kind)
			sim := apitest.Simulator(t, acquirer.Options{Slow: slow})
			seen := &seenAcquirer{Acquirer: sim}
			f := fixture{inst: apitest.Start(t, store, seen, engine.Options{AcquirerTimeout: 2 * slow}), sim: sim, store: store}
			doneOrder := orderSeq.Add(1)
			done := apitest.Charge(t, f.inst.URL, "cheap-done", chargeBody(doneOrder, "tok_ok"))
			if done.Status != 201 {
				t.Fatalf("preparing a completed key: %d %s", done.Status, done.Body)
			}
			doneID := decodeCharge(t, done.Body).ID

			// Every slot busy at the slow acquirer; finished counts the
			// slow captures that ended and freed their slot.
			var finished, shed atomic.Int32
			var wg sync.WaitGroup
			slowOrder := orderSeq.Add(burst)
			for i := range burst {
				wg.Go(func() {
					r, err := apitest.Do(t, nil, "POST", f.inst.URL+"/v1/charges", []byte(chargeBody(slowOrder+int64(i), "tok_slow")),
						map[string]string{"Idempotency-Key": fmt.Sprintf("cheap-slow-%d", i)})
					switch {
					case err != nil:
						t.Errorf("slow attempt %d: %v", i, err)
					case r.Status == 201:
						finished.Add(1)
					case r.Status == 429:
						shed.Add(1)
					default:
						t.Errorf("slow attempt %d: %d %s, want 201 or 429 rate-limited", i, r.Status, r.Body)
					}
				})
			}
			defer wg.Wait()
			// Measure once the burst has settled: every slot at the
			// acquirer, the rest shed (so that what is measured is the
			// cheap answers, not the burst's own inserts and releases
			// queueing at the database).
			apitest.Eventually(t, 10*time.Second, "every slot to be at the acquirer", func() bool {
				return f.sim.Stats().CaptureRequests == 1+slots
			})
			for deadline := time.Now().Add(2 * time.Second); shed.Load() != burst-slots && time.Now().Before(deadline); {
				time.Sleep(10 * time.Millisecond)
			}
			t.Logf("%s: burst of %d: %d at the acquirer, %d shed (429 rate-limited)", kind, burst, f.sim.Stats().CaptureRequests-1, shed.Load())
			// A key whose attempt is at the acquirer (they all take 10 s).
			var inFlightKey string
			for _, ref := range seen.refs() {
				if ch, err := store.ChargeGet(context.Background(), "demo", ref); err == nil && ch.Status == chargeonce.StatusProcessing {
					inFlightKey = ch.IdempotencyKey
					break
				}
			}
			var inFlight int
			if _, err := fmt.Sscanf(inFlightKey, "cheap-slow-%d", &inFlight); err != nil {
				t.Fatalf("no attempt of the burst found at the acquirer (%q: %v)", inFlightKey, err)
			}

			lat := map[string][]time.Duration{}
			var all []time.Duration
			measure := func(what string, status int, method, url string, body []byte, key string) apitest.Result {
				t.Helper()
				var h map[string]string
				if key != "" {
					h = map[string]string{"Idempotency-Key": key}
				}
				t0 := time.Now()
				r, err := apitest.Do(t, nil, method, url, body, h)
				d := time.Since(t0)
				if err != nil {
					t.Fatalf("%s: %v", what, err)
				}
				if n := finished.Load(); n != 0 {
					t.Fatalf("%s was answered only after %d slow attempt(s) had finished and freed a slot (it took %s): it waited for an acquirer slot", what, n, d)
				}
				if r.Status != status {
					t.Fatalf("%s: %d %s, want %d", what, r.Status, r.Body, status)
				}
				lat[what] = append(lat[what], d)
				all = append(all, d)
				return r
			}
			const rounds = 20
			for range rounds {
				r := measure("replay", 201, "POST", f.inst.URL+"/v1/charges", []byte(chargeBody(doneOrder, "tok_ok")), "cheap-done")
				if r.Header.Get("Idempotent-Replayed") != "true" {
					t.Fatalf("replay not flagged")
				}
				measure("422", 422, "POST", f.inst.URL+"/v1/charges", []byte(chargeBody(doneOrder+1, "tok_ok")), "cheap-done")
				r = measure("409", 409, "POST", f.inst.URL+"/v1/charges", []byte(chargeBody(slowOrder+int64(inFlight), "tok_slow")), inFlightKey)
				retryAfter(t, r)
				measure("GET by id", 200, "GET", f.inst.URL+"/v1/charges/"+doneID, nil, "")
				measure("GET by order", 200, "GET", fmt.Sprintf("%s/v1/charges?order_id=%d", f.inst.URL, doneOrder), nil, "")
			}
			for _, what := range []string{"replay", "422", "409", "GET by id", "GET by order"} {
				ds := lat[what]
				t.Logf("%s: %-12s with all %d acquirer slots busy: p50 %s  p99 %s  max %s  (n=%d)", kind, what, slots,
					quantile(ds, 0.5).Round(10*time.Microsecond), quantile(ds, 0.99).Round(10*time.Microsecond), quantile(ds, 1).Round(10*time.Microsecond), len(ds))
			}
			t.Logf("%s: all cheap answers with every slot busy: p99 %s over %d requests (target < 50ms)", kind, quantile(all, 0.99).Round(10*time.Microsecond), len(all))
		})
	}
}

// TestOverloadShedsWith503AndKeepsNothing: with every slot busy past the
// admission wait, a new charge is refused with 503 overloaded and a
// Retry-After, nothing is kept for its key (no ghost record turns its retry
// into a 409), the acquirer never hears of it, and once a slot is free the
// same key charges normally.
func TestOverloadShedsWith503AndKeepsNothing(t *testing.T) {
	t.Parallel()
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			const slots = 2
			f := setup(t, kind, engine.Options{MaxInFlight: slots, AcquirerTimeout: 10 * time.Second, AdmissionWait: 200 * time.Millisecond},
				acquirer.Options{Slow: 3 * time.Second})
			var wg sync.WaitGroup
			for i := range slots {
				wg.Go(func() {
					r, err := apitest.Do(t, nil, "POST", f.inst.URL+"/v1/charges", []byte(chargeBody(orderSeq.Add(1), "tok_slow")),
						map[string]string{"Idempotency-Key": fmt.Sprintf("shed-slow-%d", i)})
					if err != nil || r.Status != 201 {
						t.Errorf("slow attempt %d: %v %d %s", i, err, r.Status, r.Body)
					}
				})
			}
			apitest.Eventually(t, 5*time.Second, "every slot to be at the acquirer", func() bool {
				return f.sim.Stats().CaptureRequests == slots
			})
			order := orderSeq.Add(1)
			body := chargeBody(order, "tok_ok")
			for i := range 2 {
				t0 := time.Now()
				r := apitest.Charge(t, f.inst.URL, "shed-me", body)
				took := time.Since(t0)
				wantProblem(t, r, 503, "overloaded")
				ra := retryAfter(t, r)
				if _, err := f.store.KeyGet(context.Background(), "demo", "shed-me"); chargeonce.ErrorCode(err) != chargeonce.ENOTFOUND {
					t.Fatalf("after the 503, the key's record is still there (err %v): a ghost would turn the retry into a 409", err)
				}
				if list, err := f.store.ChargesListByOrder(context.Background(), "demo", order); err != nil || len(list) != 0 {
					t.Fatalf("after the 503: charges %+v (%v), want none", list, err)
				}
				t.Logf("%s: shed attempt %d answered 503 overloaded in %s, Retry-After %d", kind, i, took.Round(time.Millisecond), ra)
			}
			if n := f.sim.Stats().CaptureRequests; n != slots {
				t.Fatalf("the acquirer got %d requests, want %d: a shed attempt reached it", n, slots)
			}
			wg.Wait()
			r := apitest.Charge(t, f.inst.URL, "shed-me", body)
			if r.Status != 201 || r.Header.Get("Idempotent-Replayed") != "" {
				t.Fatalf("retry once slots are free: %d %s (replayed %q), want a fresh 201", r.Status, r.Body, r.Header.Get("Idempotent-Replayed"))
			}
			if n := f.sim.CapturedCount("demo", order); n != 1 {
				t.Fatalf("captured %d times, want 1", n)
			}
		})
	}
}

// TestAbandonedWhileWaitingKeepsNothing: a client that hangs up while its
// attempt waits for a slot costs nothing: the attempt never reaches the
// acquirer and leaves no record behind.
func TestAbandonedWhileWaitingKeepsNothing(t *testing.T) {
	t.Parallel()
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			f := setup(t, kind, engine.Options{MaxInFlight: 1, AcquirerTimeout: 10 * time.Second, AdmissionWait: 10 * time.Second},
				acquirer.Options{Slow: 2 * time.Second})
			slowDone := make(chan struct{})
			go func() {
				defer close(slowDone)
				apitest.Charge(t, f.inst.URL, "abandon-slow", chargeBody(orderSeq.Add(1), "tok_slow"))
			}()
			apitest.Eventually(t, 5*time.Second, "the slot to be at the acquirer", func() bool {
				return f.sim.Stats().CaptureRequests == 1
			})
			order := orderSeq.Add(1)
			c := &http.Client{Timeout: 300 * time.Millisecond}
			if r, err := apitest.Do(t, c, "POST", f.inst.URL+"/v1/charges", []byte(chargeBody(order, "tok_ok")), map[string]string{"Idempotency-Key": "abandon-me"}); err == nil {
				t.Fatalf("the attempt was answered (%d %s) while the only slot was busy; want it still waiting when the client gives up", r.Status, r.Body)
			}
			apitest.Eventually(t, 2*time.Second, "the abandoned attempt's record to be released", func() bool {
				_, err := f.store.KeyGet(context.Background(), "demo", "abandon-me")
				return chargeonce.ErrorCode(err) == chargeonce.ENOTFOUND
			})
			<-slowDone
			if n := f.sim.Stats().CaptureRequests; n != 1 {
				t.Fatalf("the acquirer got %d requests, want 1: the abandoned attempt reached it", n)
			}
			if list, err := f.store.ChargesListByOrder(context.Background(), "demo", order); err != nil || len(list) != 0 {
				t.Fatalf("abandoned attempt left charges %+v (%v)", list, err)
			}
		})
	}
}

// seenAcquirer passes every capture to the real acquirer it wraps and
// remembers which references reached it.
type seenAcquirer struct {
	chargeonce.Acquirer
	mu   sync.Mutex
	seen []string
}

func (a *seenAcquirer) Capture(ctx context.Context, req chargeonce.CaptureRequest) (chargeonce.CaptureResult, error) {
	a.mu.Lock()
	a.seen = append(a.seen, req.Reference)
	a.mu.Unlock()
	return a.Acquirer.Capture(ctx, req)
}

func (a *seenAcquirer) refs() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.seen)
}

// downAcquirer is a real HTTP acquirer that is down: it answers every
// capture with 503 (an unknown outcome) and records when each arrived.
type downAcquirer struct {
	mu    sync.Mutex
	calls []time.Time
}

func (d *downAcquirer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	d.mu.Lock()
	d.calls = append(d.calls, time.Now())
	d.mu.Unlock()
	http.Error(w, "down for maintenance", http.StatusServiceUnavailable)
}

func (d *downAcquirer) times() []time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.calls)
}

// TestRetriesDuringOutageRespectBackoff: while the acquirer is down, a client
// retrying as fast as it can must not make the acquirer be called more often
// than the back-off allows. Each unknown outcome backs the record off like
// recovery does, and retries in that window get 202 (or 409) with a
// Retry-After, without a call.
func TestRetriesDuringOutageRespectBackoff(t *testing.T) {
	t.Parallel()
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			const base = 300 * time.Millisecond
			const window = 2500 * time.Millisecond
			down := &downAcquirer{}
			acqSrv := httptest.NewServer(down)
			t.Cleanup(acqSrv.Close)
			store := apitest.Store(t, kind)
			inst := apitest.Start(t, store, acquirer.NewClient(acqSrv.URL, nil), engine.Options{AcquirerTimeout: time.Second, BackoffBase: base})

			order := orderSeq.Add(1)
			body := chargeBody(order, "tok_ok")
			first := apitest.Charge(t, inst.URL, "outage", body)
			if first.Status != 202 {
				t.Fatalf("first attempt during the outage: %d %s, want 202", first.Status, first.Body)
			}
			id := decodeCharge(t, first.Body).ID
			retryAfter(t, first)
			statuses := map[int]int{}
			start := time.Now()
			for time.Since(start) < window {
				r := apitest.Charge(t, inst.URL, "outage", body)
				statuses[r.Status]++
				switch r.Status {
				case 202:
					if c := decodeCharge(t, r.Body); c.ID != id || c.Status != "processing" {
						t.Fatalf("202 during the outage: %+v, want charge %s processing", c, id)
					}
				case 409:
					wantProblem(t, r, 409, "request-in-progress")
				default:
					t.Fatalf("retry during the outage: %d %s, want 202 or 409", r.Status, r.Body)
				}
				retryAfter(t, r)
				time.Sleep(5 * time.Millisecond)
			}
			calls := down.times()
			retries := 0
			for _, n := range statuses {
				retries += n
			}
			t.Logf("%s: %d retries in %s during the outage (answers %v) made %d acquirer calls; back-off base %s",
				kind, retries, window, statuses, len(calls), base)
			// The i-th call's unknown outcome backed the record off by at
			// least half of base*2^i (equal jitter): the next call cannot
			// come sooner.
			for i := 1; i < len(calls); i++ {
				gap := calls[i].Sub(calls[i-1])
				lower := min(base<<(i-1), engine.DefaultBackoffMax) / 2
				if gap < lower-10*time.Millisecond {
					t.Fatalf("acquirer calls %d and %d came %s apart; the back-off after %d unknown outcome(s) is at least %s (calls: %d for %d retries)",
						i, i+1, gap.Round(time.Millisecond), i, lower, len(calls), retries)
				}
			}
			if maxCalls := 1 + int(window/(base/2)); len(calls) > maxCalls {
				t.Fatalf("%d acquirer calls for %d retries in %s; want at most %d", len(calls), retries, window, maxCalls)
			}
			rec, err := store.KeyGet(context.Background(), "demo", "outage")
			if err != nil || rec.State != chargeonce.KeyProcessing {
				t.Fatalf("record after the outage: %+v, %v; want processing", rec, err)
			}
			if rec.RecoveryAttempts != len(calls) {
				t.Fatalf("record counts %d attempts, want %d (one per unknown outcome)", rec.RecoveryAttempts, len(calls))
			}
		})
	}
}

// TestRetryAfterFromRemainingLease: a 409's Retry-After says when the lease
// of the attempt holding the key ends (rounded up to whole seconds), capped
// by the acquirer timeout when that attempt is at the acquirer and will
// answer sooner.
func TestRetryAfterFromRemainingLease(t *testing.T) {
	t.Parallel()
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			f := setup(t, kind, engine.Options{Lease: 30 * time.Second, AcquirerTimeout: 5 * time.Second}, acquirer.Options{Slow: 1500 * time.Millisecond})
			// An attempt that crashed after its insert: a record whose lease
			// ends in about 3 s, and nobody driving it.
			order := orderSeq.Add(1)
			body := chargeBody(order, "tok_ok")
			req, err := wire.DecodeChargeRequest([]byte(body))
			if err != nil {
				t.Fatal(err)
			}
			if _, inserted, err := f.store.KeyInsert(context.Background(), chargeonce.KeyInsertParams{
				Fingerprint: idempotency.Fingerprint("POST", "/v1/charges", &req),
				Token:       idempotency.NewToken(),
				Lease:       3 * time.Second,
				Charge: chargeonce.Charge{ID: idempotency.NewChargeID(), MerchantID: "demo", IdempotencyKey: "orphan",
					OrderID: req.OrderID, AmountCents: req.AmountCents, Currency: req.Currency, PaymentToken: req.PaymentToken},
			}); err != nil || !inserted {
				t.Fatalf("inserting the orphan: inserted=%v %v", inserted, err)
			}
			r := apitest.Charge(t, f.inst.URL, "orphan", body)
			wantProblem(t, r, 409, "request-in-progress")
			if ra := retryAfter(t, r); ra < 2 || ra > 3 {
				t.Fatalf("409 for a lease ending in ~3s has Retry-After %d; want 3 (or 2 on a slow machine)", ra)
			}

			// An attempt at the acquirer: its lease has ~30 s to run, but it
			// answers within the acquirer timeout (5 s).
			slowOrder := orderSeq.Add(1)
			slowDone := make(chan struct{})
			go func() {
				defer close(slowDone)
				apitest.Charge(t, f.inst.URL, "in-flight", chargeBody(slowOrder, "tok_slow"))
			}()
			apitest.Eventually(t, 5*time.Second, "the attempt to reach the acquirer", func() bool {
				return f.sim.Stats().CaptureRequests == 1
			})
			r = apitest.Charge(t, f.inst.URL, "in-flight", chargeBody(slowOrder, "tok_slow"))
			wantProblem(t, r, 409, "request-in-progress")
			if ra := retryAfter(t, r); ra != 5 {
				t.Fatalf("409 while the owner is at the acquirer has Retry-After %d; want 5 (the acquirer timeout, shorter than the 30 s lease)", ra)
			}
			<-slowDone
		})
	}
}

// admissionLog records every admission wait the engine reports.
type admissionLog struct {
	mu    sync.Mutex
	waits []time.Duration
}

func (a *admissionLog) AcquirerCall(time.Duration, error) {}

func (a *admissionLog) Admission(wait time.Duration, admitted bool) {
	a.mu.Lock()
	a.waits = append(a.waits, wait)
	a.mu.Unlock()
}

func (a *admissionLog) take() []time.Duration {
	a.mu.Lock()
	defer a.mu.Unlock()
	w := a.waits
	a.waits = nil
	return w
}

// TestAdmissionWaitSizing measures what DefaultAdmissionWait is sized from:
// how long new charges wait for one of the default 64 acquirer slots when a
// burst of them arrives at once, at several acquirer latencies. Nothing is
// shed here (the wait is unbounded for the measurement); it prints the
// waits and how many attempts each candidate bound would have shed.
func TestAdmissionWaitSizing(t *testing.T) {
	t.Parallel()
	store := apitest.Store(t, "postgres")
	for _, run := range []struct {
		latency time.Duration
		burst   int
	}{
		{50 * time.Millisecond, 128},
		{200 * time.Millisecond, 96},
		{200 * time.Millisecond, 128},
		{time.Second, 128},
	} {
		sim := apitest.Simulator(t, acquirer.Options{Latency: run.latency})
		log := &admissionLog{}
		inst := apitest.Start(t, store, sim, engine.Options{AdmissionWait: time.Minute, AcquirerTimeout: 10 * time.Second, Observer: log})
		go0 := make(chan struct{})
		var wg sync.WaitGroup
		var bad atomic.Int32
		base := orderSeq.Add(int64(run.burst))
		for i := range run.burst {
			wg.Go(func() {
				<-go0
				r, err := apitest.Do(t, nil, "POST", inst.URL+"/v1/charges", []byte(chargeBody(base+int64(i), "tok_ok")),
					map[string]string{"Idempotency-Key": fmt.Sprintf("sizing-%d-%d", base, i)})
				if err != nil || r.Status != 201 {
					bad.Add(1)
					t.Errorf("burst charge %d: %v %d %s", i, err, r.Status, r.Body)
				}
			})
		}
		t0 := time.Now()
		close(go0)
		wg.Wait()
		took := time.Since(t0)
		waits := log.take()
		if len(waits) != run.burst || bad.Load() != 0 {
			t.Fatalf("%d admissions for a burst of %d (%d failed)", len(waits), run.burst, bad.Load())
		}
		shed := func(bound time.Duration) int {
			n := 0
			for _, w := range waits {
				if w > bound {
					n++
				}
			}
			return n
		}
		t.Logf("acquirer %-6s burst %3d (64 slots): slot wait p50 %-8s p90 %-8s p99 %-8s max %-8s; would shed at 100ms: %d, 250ms: %d, 500ms: %d, 1s: %d; burst done in %s",
			run.latency, run.burst,
			quantile(waits, 0.5).Round(time.Millisecond), quantile(waits, 0.9).Round(time.Millisecond),
			quantile(waits, 0.99).Round(time.Millisecond), quantile(waits, 1).Round(time.Millisecond),
			shed(100*time.Millisecond), shed(250*time.Millisecond), shed(500*time.Millisecond), shed(time.Second), took.Round(time.Millisecond))
	}
}
