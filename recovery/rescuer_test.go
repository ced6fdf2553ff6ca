package recovery_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/idempotency"
	"github.com/chargeonce/chargeonce/internal/apitest"
	"github.com/chargeonce/chargeonce/internal/pgtest"
	"github.com/chargeonce/chargeonce/recovery"
)

// testAcquirer sits between the engine and the simulator: it counts the
// requests per reference, and while down it answers like an acquirer that
// cannot be reached (the outcome is unknown) without reaching the simulator.
type testAcquirer struct {
	next chargeonce.Acquirer
	down atomic.Bool

	mu    sync.Mutex
	calls map[string]int
}

func newTestAcquirer(next chargeonce.Acquirer) *testAcquirer {
	return &testAcquirer{next: next, calls: map[string]int{}}
}

func (a *testAcquirer) Capture(ctx context.Context, req chargeonce.CaptureRequest) (chargeonce.CaptureResult, error) {
	a.mu.Lock()
	a.calls[req.Reference]++
	a.mu.Unlock()
	if a.down.Load() {
		return chargeonce.CaptureResult{}, errors.New("dial tcp 127.0.0.1:9: connect: connection refused")
	}
	return a.next.Capture(ctx, req)
}

// Lookup passes through, unless down.
func (a *testAcquirer) Lookup(ctx context.Context, req chargeonce.LookupRequest) (chargeonce.LookupResult, error) {
	if a.down.Load() {
		return chargeonce.LookupResult{}, errors.New("dial tcp 127.0.0.1:9: connect: connection refused")
	}
	return a.next.Lookup(ctx, req)
}

// callsPer returns how many requests each reference got.
func (a *testAcquirer) callsPer() map[string]int {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make(map[string]int, len(a.calls))
	for k, v := range a.calls {
		out[k] = v
	}
	return out
}

// faultyStore is a store whose writes of final answers fail while
// completeFails is positive (one failure per call), as when the database
// connection breaks after the acquirer answered. With leaseFails set,
// handing a record to recovery fails too (the database is unreachable).
type faultyStore struct {
	chargeonce.Store
	completeFails atomic.Int64
	leaseFails    atomic.Bool
	completes     atomic.Int64
}

func (s *faultyStore) KeyComplete(ctx context.Context, p chargeonce.KeyCompleteParams) error {
	s.completes.Add(1)
	if s.completeFails.Add(-1) >= 0 {
		return errors.New("completing idempotency key: injected fault: FATAL: terminating connection due to administrator command (SQLSTATE 57P01)")
	}
	return s.Store.KeyComplete(ctx, p)
}

func (s *faultyStore) KeyLeaseSet(ctx context.Context, merchantID, key, token string, d time.Duration, recoveryAttempt bool) error {
	if s.leaseFails.Load() {
		return errors.New("setting idempotency key lease: injected fault: connection refused")
	}
	return s.Store.KeyLeaseSet(ctx, merchantID, key, token, d, recoveryAttempt)
}

// claimCounter counts, per record, how often KeysClaimExpired handed it out.
type claimCounter struct {
	mu     sync.Mutex
	claims map[string]int
}

type countingStore struct {
	chargeonce.Store
	counter *claimCounter
	// ready, when set, is waited for before the first claim, so that two
	// rescuers start claiming at the same moment.
	ready *sync.WaitGroup
	once  sync.Once
}

func (s *countingStore) KeysClaimExpired(ctx context.Context, lease time.Duration, limit int) ([]chargeonce.KeyRecord, error) {
	if s.ready != nil {
		s.once.Do(func() { s.ready.Done(); s.ready.Wait() })
	}
	recs, err := s.Store.KeysClaimExpired(ctx, lease, limit)
	s.counter.mu.Lock()
	for _, r := range recs {
		s.counter.claims[r.MerchantID+"/"+r.Key]++
	}
	s.counter.mu.Unlock()
	return recs, err
}

// env is one chargeonce instance's parts over a fresh PostgreSQL schema.
type env struct {
	url   string
	store chargeonce.Store
	sim   *acquirer.Simulator
	acq   *testAcquirer
	eng   *engine.Engine
}

func setup(t *testing.T, store func(chargeonce.Store) chargeonce.Store, opts engine.Options) *env {
	t.Helper()
	e := &env{url: pgtest.URL(t)}
	e.store = apitest.PostgresStoreAt(t, e.url)
	if store != nil {
		e.store = store(e.store)
	}
	e.sim = apitest.Simulator(t, acquirer.Options{Slow: 50 * time.Millisecond})
	e.acq = newTestAcquirer(e.sim)
	if opts.Lease == 0 {
		opts.Lease = 2 * time.Second
	}
	if opts.AcquirerTimeout == 0 {
		opts.AcquirerTimeout = time.Second
	}
	e.eng = engine.New(e.store, e.acq, opts)
	return e
}

var orderSeq atomic.Int64

func init() { orderSeq.Store(time.Now().UnixNano() % 1e9 * 1000) }

// request returns a normalised charge request for a new order.
func request(token string) *chargeonce.ChargeRequest {
	r := &chargeonce.ChargeRequest{OrderID: orderSeq.Add(1), AmountCents: 2500, PaymentToken: token}
	if err := r.Normalize(); err != nil {
		panic(err)
	}
	return r
}

// orphan inserts the record an attempt leaves behind when it dies after
// committing it (before or during its acquirer call), with its lease
// already over, exactly as the engine would have inserted it.
func orphan(t *testing.T, s chargeonce.Store, key string, req *chargeonce.ChargeRequest) chargeonce.KeyRecord {
	t.Helper()
	rec, inserted, err := s.KeyInsert(t.Context(), chargeonce.KeyInsertParams{
		Fingerprint: idempotency.Fingerprint("POST", "/v1/charges", req),
		Token:       idempotency.NewToken(),
		Lease:       0,
		Charge: chargeonce.Charge{
			ID:             idempotency.NewChargeID(),
			MerchantID:     "demo",
			IdempotencyKey: key,
			OrderID:        req.OrderID,
			AmountCents:    req.AmountCents,
			Currency:       req.Currency,
			PaymentToken:   req.PaymentToken,
		},
	})
	if err != nil || !inserted {
		t.Fatalf("inserting orphan %s: inserted=%v err=%v", key, inserted, err)
	}
	return rec
}

func get(t *testing.T, s chargeonce.Store, key string) chargeonce.KeyRecord {
	t.Helper()
	rec, err := s.KeyGet(t.Context(), "demo", key)
	if err != nil {
		t.Fatalf("KeyGet(%s): %v", key, err)
	}
	return rec
}

// wantReplay retries the intent through the engine and wants the stored
// answer back, byte for byte.
func wantReplay(t *testing.T, e *env, key string, req *chargeonce.ChargeRequest, status int) engine.Response {
	t.Helper()
	resp, err := e.eng.Charge(t.Context(), "demo", key, req)
	if err != nil {
		t.Fatalf("retry of %s: %v", key, err)
	}
	rec := get(t, e.store, key)
	if !resp.Replayed || resp.Status != status || !bytes.Equal(resp.Body, rec.ResponseBody) {
		t.Fatalf("retry of %s answered %d (replayed=%v) %s; want the stored %d %s", key, resp.Status, resp.Replayed, resp.Body, status, rec.ResponseBody)
	}
	return resp
}

// TestRunOnceSettlesOrphans: attempts that died after committing their
// record, before the acquirer was called or after it captured, are settled
// by one pass with the same reference; retries replay the stored answers and
// nobody is charged twice.
func TestRunOnceSettlesOrphans(t *testing.T) {
	t.Parallel()
	e := setup(t, nil, engine.Options{})
	ok, declined, captured := request("tok_ok"), request("tok_declined"), request("tok_ok")
	orphan(t, e.store, "never-called", ok)
	orphan(t, e.store, "declined", declined)
	rec := orphan(t, e.store, "died-after-capture", captured)
	// The dead attempt's capture reached the acquirer before it died.
	if _, err := e.sim.Capture(t.Context(), chargeonce.CaptureRequest{
		Reference: rec.Charge.Reference(), OrderID: captured.OrderID, Merchant: "demo",
		AmountCents: captured.AmountCents, Currency: captured.Currency, PaymentToken: captured.PaymentToken,
	}); err != nil {
		t.Fatal(err)
	}
	var stuck []chargeonce.StuckStats
	r := recovery.NewRescuer(e.store, e.eng, recovery.RescuerOptions{OnPass: func(p recovery.PassResult) { stuck = append(stuck, p.Stuck) }})

	res, err := r.RunOnce(t.Context())
	if err != nil {
		t.Fatalf("RunOnce: %v", err)
	}
	if res.Claimed != 3 || res.Settled != 3 || res.Deferred != 0 || res.Stuck.Count != 0 {
		t.Fatalf("RunOnce = %+v; want 3 claimed, 3 settled, none stuck", res)
	}
	if len(stuck) != 1 || stuck[0].Count != 0 {
		t.Fatalf("OnPass got %+v; want one report of zero", stuck)
	}
	wantReplay(t, e, "never-called", ok, 201)
	wantReplay(t, e, "declined", declined, 402)
	wantReplay(t, e, "died-after-capture", captured, 201)
	for _, o := range []int64{ok.OrderID, captured.OrderID} {
		if n := e.sim.CapturedCount("demo", o); n != 1 {
			t.Errorf("order %d captured %d times, want 1", o, n)
		}
	}
	// The capture of the attempt that died was found by the lookup, not
	// sent again; the two never sent were sent once each.
	if st := e.sim.Stats(); st.Captures != 2 || st.CaptureRequests != 3 || st.DuplicateRequests != 0 {
		t.Errorf("acquirer stats %+v; want 2 captures, 3 requests and no re-sent reference", st)
	}
	// Nothing left: a second pass claims nothing.
	if res, err := r.RunOnce(t.Context()); err != nil || res.Claimed != 0 {
		t.Fatalf("second RunOnce = %+v, %v; want nothing claimed", res, err)
	}
}

// TestTwoRescuersClaimEachOrphanOnce: two recovery loops on separate
// connection pools (two instances) race over 200 orphans; each orphan is
// claimed by exactly one of them and reaches the acquirer exactly once.
func TestTwoRescuersClaimEachOrphanOnce(t *testing.T) {
	t.Parallel()
	const orphans = 200
	url := pgtest.URL(t)
	sim := apitest.Simulator(t, acquirer.Options{Latency: 2 * time.Millisecond})
	acq := newTestAcquirer(sim)
	counter := &claimCounter{claims: map[string]int{}}
	var ready sync.WaitGroup
	ready.Add(2)
	var rescuers []*recovery.Rescuer
	var stores []*countingStore
	for range 2 {
		s := &countingStore{Store: apitest.PostgresStoreAt(t, url), counter: counter, ready: &ready}
		stores = append(stores, s)
		eng := engine.New(s, acq, engine.Options{Lease: 10 * time.Second, AcquirerTimeout: 5 * time.Second})
		// Each worker claims one record at a time, so each rescuer goes
		// back for more while the other is still claiming.
		rescuers = append(rescuers, recovery.NewRescuer(s, eng, recovery.RescuerOptions{}))
	}
	refs := map[string]string{} // key -> reference
	for i := range orphans {
		key := fmt.Sprintf("orphan-%03d", i)
		rec := orphan(t, stores[0].Store, key, request("tok_ok"))
		refs[key] = rec.Charge.Reference()
	}

	results := make([]recovery.PassResult, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i, r := range rescuers {
		wg.Go(func() { results[i], errs[i] = r.RunOnce(t.Context()) })
	}
	wg.Wait()
	for i := range 2 {
		if errs[i] != nil {
			t.Fatalf("rescuer %d: %v", i, errs[i])
		}
	}
	t.Logf("rescuer 0: %+v; rescuer 1: %+v", results[0], results[1])
	if results[0].Claimed == 0 || results[1].Claimed == 0 {
		t.Errorf("one rescuer claimed nothing (%d, %d): the passes did not race", results[0].Claimed, results[1].Claimed)
	}
	if got := results[0].Claimed + results[1].Claimed; got != orphans {
		t.Errorf("claimed %d in total, want %d", got, orphans)
	}
	if got := results[0].Settled + results[1].Settled; got != orphans {
		t.Errorf("settled %d in total, want %d", got, orphans)
	}
	calls := acq.callsPer()
	for key, ref := range refs {
		if n := counter.claims["demo/"+key]; n != 1 {
			t.Errorf("%s claimed %d times, want 1", key, n)
		}
		if n := calls[ref]; n != 1 {
			t.Errorf("%s: acquirer got %d requests for reference %s, want 1", key, n, ref)
		}
	}
	if st := sim.Stats(); st.Captures != orphans || st.DuplicateRequests != 0 {
		t.Errorf("acquirer stats %+v; want %d captures and no duplicate request", st, orphans)
	}
}

// TestWriteFailsEveryRetry: the acquirer captured, but every attempt to
// store its answer failed. The attempt answers 202 and hands the record to
// recovery after a back-off; recovery re-drives the acquirer with the same reference,
// which moves no money again, stores the answer, and the retry replays it.
func TestWriteFailsEveryRetry(t *testing.T) {
	t.Parallel()
	var fs *faultyStore
	e := setup(t, func(s chargeonce.Store) chargeonce.Store { fs = &faultyStore{Store: s}; return fs }, engine.Options{})
	fs.completeFails.Store(int64(engine.DefaultWriteRetries))
	req := request("tok_ok")

	resp, err := e.eng.Charge(t.Context(), "demo", "k", req)
	if err != nil || resp.Status != 202 {
		t.Fatalf("first attempt: %d %s, %v; want 202", resp.Status, resp.Body, err)
	}
	if n := fs.completes.Load(); n != int64(engine.DefaultWriteRetries) {
		t.Fatalf("the answer was written %d times, want %d tries", n, engine.DefaultWriteRetries)
	}
	rec := get(t, e.store, "k")
	if rec.State != chargeonce.KeyProcessing || rec.RecoveryAttempts != 1 {
		t.Fatalf("after the failed writes the record is %s (%d attempts); want processing, handed to recovery after a back-off", rec.State, rec.RecoveryAttempts)
	}
	if n := e.sim.CapturedCount("demo", req.OrderID); n != 1 {
		t.Fatalf("acquirer captured %d times before recovery, want 1", n)
	}

	waitDue(t, e.store, "k")
	res, err := recovery.NewRescuer(e.store, e.eng, recovery.RescuerOptions{}).RunOnce(t.Context())
	if err != nil || res.Settled != 1 {
		t.Fatalf("RunOnce = %+v, %v; want the record settled", res, err)
	}
	final := wantReplay(t, e, "k", req, 201)
	if !bytes.Contains(final.Body, []byte(rec.Charge.ID)) || !bytes.Contains(final.Body, []byte(`"captured"`)) {
		t.Fatalf("replay %s is not charge %s captured", final.Body, rec.Charge.ID)
	}
	// Recovery looked the reference up and settled from the capture the
	// acquirer holds: it did not send it again.
	if n := e.acq.callsPer()[rec.Charge.Reference()]; n != 1 {
		t.Errorf("acquirer got %d capture requests for the reference, want 1 (the attempt; recovery looks it up)", n)
	}
	if n := e.sim.CapturedCount("demo", req.OrderID); n != 1 {
		t.Errorf("acquirer captured %d times, want 1", n)
	}
}

// TestDatabaseGoneAfterCapture: the acquirer captured and then the database
// was unreachable for both the write and the hand-off. The record keeps the
// attempt's lease, so recovery leaves it alone until that lease ends, and
// then settles it with the same reference.
func TestDatabaseGoneAfterCapture(t *testing.T) {
	t.Parallel()
	var fs *faultyStore
	const lease = 1500 * time.Millisecond
	e := setup(t, func(s chargeonce.Store) chargeonce.Store { fs = &faultyStore{Store: s}; return fs },
		engine.Options{Lease: lease, AcquirerTimeout: time.Second})
	fs.completeFails.Store(int64(engine.DefaultWriteRetries))
	fs.leaseFails.Store(true)
	req := request("tok_ok")
	resp, err := e.eng.Charge(t.Context(), "demo", "k", req)
	if err != nil || resp.Status != 202 {
		t.Fatalf("first attempt: %d %s, %v; want 202", resp.Status, resp.Body, err)
	}
	fs.leaseFails.Store(false) // the database is back

	r := recovery.NewRescuer(e.store, e.eng, recovery.RescuerOptions{})
	if rec := get(t, e.store, "k"); rec.LeaseExpired {
		t.Fatalf("the record's lease ended at once (%v); the hand-off should have failed", rec.LeaseUntil)
	}
	if res, err := r.RunOnce(t.Context()); err != nil || res.Claimed != 0 {
		t.Fatalf("RunOnce during the attempt's lease = %+v, %v; want nothing claimed", res, err)
	}
	// While the lease runs a retry is told to come back later.
	if _, err := e.eng.Charge(t.Context(), "demo", "k", req); chargeonce.ErrorCode(err) != chargeonce.EINPROGRESS {
		t.Fatalf("retry during the lease: %v; want EINPROGRESS", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		res, err := r.RunOnce(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if res.Settled == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the record was not recovered within 10s of its lease")
		}
		time.Sleep(50 * time.Millisecond)
	}
	wantReplay(t, e, "k", req, 201)
	if n := e.sim.CapturedCount("demo", req.OrderID); n != 1 {
		t.Errorf("acquirer captured %d times, want 1", n)
	}
}

// TestBackoffWhileAcquirerDown: while the acquirer cannot be reached,
// recovery retries each record after a growing back-off, counts its
// attempts, reports it as stuck (also between passes, while it is backed
// off), and moves no money; once the acquirer is back, recovery settles it.
func TestBackoffWhileAcquirerDown(t *testing.T) {
	t.Parallel()
	e := setup(t, nil, engine.Options{})
	e.acq.down.Store(true)
	req := request("tok_ok")
	resp, err := e.eng.Charge(t.Context(), "demo", "k", req)
	if err != nil || resp.Status != 202 {
		t.Fatalf("first attempt: %d %s, %v; want 202", resp.Status, resp.Body, err)
	}
	// The client's unknown outcome backs the record off as recovery would,
	// and counts as an attempt.
	if rec := get(t, e.store, "k"); rec.LeaseExpired || rec.RecoveryAttempts != 1 {
		t.Fatalf("after 202: lease expired %v, attempts %d; want backed off, one attempt counted", rec.LeaseExpired, rec.RecoveryAttempts)
	}

	const base, maxBackoff = 500 * time.Millisecond, time.Second
	var mu sync.Mutex
	var reports []chargeonce.StuckStats
	r := recovery.NewRescuer(e.store, e.eng, recovery.RescuerOptions{
		BackoffBase: base, BackoffMax: maxBackoff,
		OnPass: func(p recovery.PassResult) { mu.Lock(); reports = append(reports, p.Stuck); mu.Unlock() },
	})
	want := []time.Duration{2 * base, maxBackoff, maxBackoff} // after the client's attempt; 4*base is capped
	for i, backoff := range want {
		waitDue(t, e.store, "k")
		res, err := r.RunOnce(t.Context())
		if err != nil || res.Claimed != 1 || res.Deferred != 1 {
			t.Fatalf("pass %d = %+v, %v; want the record claimed and deferred", i, res, err)
		}
		// The record is backed off (its lease is in the future) and
		// still reported stuck: this is what the operator's gauge shows
		// during an outage.
		if res.Stuck.Count != 1 {
			t.Fatalf("pass %d reported %d stuck records; want the backed-off record", i, res.Stuck.Count)
		}
		rec := get(t, e.store, "k")
		if rec.State != chargeonce.KeyProcessing || rec.RecoveryAttempts != i+2 {
			t.Fatalf("pass %d: record %s with %d attempts; want processing with %d", i, rec.State, rec.RecoveryAttempts, i+2)
		}
		// The back-off is jittered into [backoff/2, backoff].
		if left := time.Until(rec.LeaseUntil); left > backoff || left < backoff/2-200*time.Millisecond {
			t.Fatalf("pass %d: next attempt in %v, want a back-off between %v and %v", i, left, backoff/2, backoff)
		}
		// While backed off, nobody takes it: not another pass, and not a
		// client retry, which is told to come back later.
		if res, _ := r.RunOnce(t.Context()); res.Claimed != 0 {
			t.Fatalf("pass %d: a record under back-off was claimed again at once", i)
		}
		if _, err := e.eng.Charge(t.Context(), "demo", "k", req); chargeonce.ErrorCode(err) != chargeonce.EINPROGRESS && err != nil {
			t.Fatalf("retry under back-off: %v", err)
		}
	}
	if st := e.sim.Stats(); st.CaptureRequests != 0 {
		t.Fatalf("the acquirer was reached while down: %+v", st)
	}

	e.acq.down.Store(false)
	waitDue(t, e.store, "k")
	res, err := r.RunOnce(t.Context())
	if err != nil || res.Settled != 1 || res.Stuck.Count != 0 {
		t.Fatalf("pass after the outage = %+v, %v; want settled and nothing stuck", res, err)
	}
	wantReplay(t, e, "k", req, 201)
	if n := e.sim.CapturedCount("demo", req.OrderID); n != 1 {
		t.Errorf("acquirer captured %d times, want 1", n)
	}
	mu.Lock()
	defer mu.Unlock()
	if last := reports[len(reports)-1]; last.Count != 0 {
		t.Errorf("last stuck report %+v, want zero once settled", last)
	}
}

// waitDue waits until the record's lease has ended.
func waitDue(t *testing.T, s chargeonce.Store, key string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !get(t, s, key).LeaseExpired {
		if time.Now().After(deadline) {
			t.Fatalf("%s's lease did not end within 10s", key)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestRunOnceEndsDuringOutage: with more stuck records than the workers
// and a back-off shorter than a round takes, records become due again
// before the pass is over. The pass must still end (and report them), rather than go
// round the same records for as long as the acquirer stays down.
func TestRunOnceEndsDuringOutage(t *testing.T) {
	t.Parallel()
	const orphans, workers = 30, 10
	e := setup(t, nil, engine.Options{})
	e.acq.down.Store(true)
	for i := range orphans {
		orphan(t, e.store, fmt.Sprintf("o-%02d", i), request("tok_ok"))
	}
	r := recovery.NewRescuer(e.store, e.eng, recovery.RescuerOptions{
		Parallelism: workers, BackoffBase: time.Millisecond, BackoffMax: time.Millisecond,
	})
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	res, err := r.RunOnce(ctx)
	if err != nil {
		t.Fatalf("RunOnce did not end by itself: %+v, %v", res, err)
	}
	if res.Claimed < orphans || res.Claimed > orphans+workers || res.Settled != 0 {
		t.Fatalf("RunOnce = %+v; want every orphan tried once (at most one per worker again), none settled", res)
	}
	if res.Stuck.Count != orphans {
		t.Fatalf("RunOnce reported %d stuck, want %d", res.Stuck.Count, orphans)
	}
}

// TestStartStop: the background loop settles orphans, logs what it did and
// the stuck records it could not settle, and stops without logging the
// cancellation as an error.
func TestStartStop(t *testing.T) {
	t.Parallel()
	e := setup(t, nil, engine.Options{})
	var logs apitest.Buffer
	log := newLogger(&logs)
	var stuck atomic.Int64
	stuck.Store(-1)
	r := recovery.NewRescuer(e.store, e.eng, recovery.RescuerOptions{
		Every: 20 * time.Millisecond, Logger: log, BackoffBase: 50 * time.Millisecond,
		OnPass: func(p recovery.PassResult) { stuck.Store(int64(p.Stuck.Count)) },
	})
	e.acq.down.Store(true)
	down := request("tok_ok")
	orphan(t, e.store, "down", down)
	r.Start(t.Context())
	r.Start(t.Context()) // a second Start is a no-op
	defer r.Stop()

	apitest.Eventually(t, 10*time.Second, "the stuck record to be reported", func() bool {
		return stuck.Load() == 1 && strings.Contains(logs.String(), "processing records past their lease")
	})
	e.acq.down.Store(false)
	apitest.Eventually(t, 10*time.Second, "the record to be settled", func() bool {
		return get(t, e.store, "down").State == chargeonce.KeyCompleted && stuck.Load() == 0
	})
	r.Stop()
	r.Stop() // idempotent
	out := logs.String()
	// With a back-off this short, workers may claim the record again in the
	// same pass (each claim is a lease of its own, driven by one worker).
	for _, want := range []string{`msg="recovery pass" claimed=[1-9] settled=0 deferred=[1-9]`, `msg="recovery pass" claimed=1 settled=1`, "count=1 oldest_age="} {
		if !regexp.MustCompile(want).MatchString(out) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "context canceled") || strings.Contains(out, "level=ERROR") {
		t.Errorf("log has errors:\n%s", out)
	}
	if n := e.sim.CapturedCount("demo", down.OrderID); n != 1 {
		t.Errorf("captured %d times, want 1", n)
	}
}

func newLogger(w *apitest.Buffer) *slog.Logger { return slog.New(slog.NewTextHandler(w, nil)) }

func contains(s, sub string) bool { return strings.Contains(s, sub) }
