package queue_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/idempotency"
	"github.com/chargeonce/chargeonce/internal/apitest"
	"github.com/chargeonce/chargeonce/queue"
	"github.com/chargeonce/chargeonce/wire"
)

// TestOverRateEveryMessageAnswered (issue 32.5): a worker whose merchant
// may start 2 charges a second, in bursts of 2, with --max-deliver 4, gets
// 30 requests at once. A 429 is a delay, not a failed delivery: every
// request is answered, none is dead-lettered, and none is redelivered to
// wait out the rate.
func TestOverRateEveryMessageAnswered(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const n = 30
	opts := e.opts
	opts.MerchantRate = engine.Rate{PerSecond: 2, Burst: 2}
	refusals := &rateLimited{}
	opts.Observer = refusals
	eng := engine.New(e.store, e.acq.client(), opts)
	obs := &redeliveries{}
	w := queue.NewWorker(e.js, eng, e.store, queue.WorkerOptions{MaxDeliver: 4, Observer: obs})
	keys := make([]string, n)
	for i := range n {
		keys[i] = fmt.Sprintf("rate-%d", i)
		e.send(keys[i], body(int64(600+i), "tok_ok"), "")
	}
	start := time.Now()
	if err := w.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	// At 2 a second after a burst of 2, the last starts after about 14 s.
	g := e.waitResults(60*time.Second, keys...)
	t.Logf("%d requests answered in %s; the engine refused %d attempts for the rate", n, time.Since(start).Round(10*time.Millisecond), refusals.n.Load())
	for i, k := range keys {
		if len(g[k]) != 1 || g[k][0].status() != "201" {
			t.Fatalf("%s: results %v; want one 201", k, g[k])
		}
		if c := e.acq.sim.CapturedCount(merchant, int64(600+i)); c != 1 {
			t.Fatalf("%s: %d captures, want 1", k, c)
		}
	}
	consumerDrained(t, e.js, queue.DefaultDurable, 20*time.Second)
	if dead := messages(t, e.js, queue.DeadSubject(merchant)); len(dead) != 0 {
		t.Fatalf("%d dead letters (reason %s); want none", len(dead), dead[0].header.Get(queue.HeaderDeadReason))
	}
	if got := obs.n.Load(); got != 0 {
		t.Fatalf("%d redeliveries while requests waited out their merchant's rate; want 0", got)
	}
	// The waiting requests are let out as tokens come, not all at every
	// Retry-After: a few refusals per answer, not one per request waiting.
	if got := refusals.n.Load(); got > 4*n {
		t.Fatalf("the engine refused %d attempts for %d requests; want at most %d", got, n, 4*n)
	}
}

// rateLimited counts the engine's refusals for a merchant's rate.
type rateLimited struct{ n atomic.Int64 }

func (*rateLimited) AcquirerCall(time.Duration, error) {}
func (r *rateLimited) RateLimited(string)              { r.n.Add(1) }

// TestOverRateCheapAnswersFirst (issue 32.5): while its merchant is over
// its rate, a request the engine answers without starting anything (a
// replay, a key reused for another request) is answered at once, not held
// for the rate; a new intent waits for its turn and is neither dropped nor
// redelivered.
func TestOverRateCheapAnswersFirst(t *testing.T) {
	t.Parallel()
	e := setup(t)
	seen := countingSub(t, e.nc)
	opts := e.opts
	opts.MerchantRate = engine.Rate{PerSecond: 1.0 / 60, Burst: 1} // one token, then one a minute
	eng := engine.New(e.store, e.acq.client(), opts)
	obs := &redeliveries{}
	w := queue.NewWorker(e.js, eng, e.store, queue.WorkerOptions{MaxDeliver: 2, Observer: obs})
	if err := w.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)

	e.send("cheap", body(81, "tok_ok"), "") // the merchant's only token
	apitest.Eventually(t, 10*time.Second, "the first answer", func() bool { return len(seen()["cheap"]) == 1 })
	sent := time.Now()
	e.send("cheap", body(81, "tok_ok"), "")    // a replay
	e.send("cheap", body(81, "tok_other"), "") // the key reused: 422
	e.send("waits", body(82, "tok_ok"), "")    // new: waits for a token
	apitest.Eventually(t, 5*time.Second, "the replay and the 422", func() bool { return len(seen()["cheap"]) == 3 })
	t.Logf("answered over the rate in %s", time.Since(sent).Round(time.Millisecond))
	got := seen()["cheap"]
	statuses := map[string]int{}
	for _, m := range got[1:] {
		statuses[m.Header.Get(queue.HeaderStatus)]++
		if m.Header.Get(queue.HeaderStatus) == "201" && (m.Header.Get(queue.HeaderReplayed) != "true" || string(m.Data) != string(got[0].Data)) {
			t.Fatalf("replay: %v %q; want the first answer's bytes, replayed", m.Header, m.Data)
		}
	}
	if statuses["201"] != 1 || statuses["422"] != 1 {
		t.Fatalf("answers over the rate: %v; want one replayed 201 and one 422", statuses)
	}
	// The new intent is kept, not redelivered nor dead-lettered, while it
	// waits for its merchant's next token.
	time.Sleep(3 * time.Second)
	if r := seen()["waits"]; len(r) != 0 {
		t.Fatalf("the new intent over the rate was answered: %v", r[0].Header)
	}
	if dead := messages(t, e.js, queue.DeadSubject(merchant)); len(dead) != 0 {
		t.Fatalf("%d dead letters (reason %s); want none", len(dead), dead[0].header.Get(queue.HeaderDeadReason))
	}
	if n := obs.n.Load(); n != 0 {
		t.Fatalf("%d redeliveries; want 0", n)
	}
	if st := e.acq.sim.Stats(); st.CaptureRequests != 1 {
		t.Fatalf("the acquirer saw %d captures, want 1", st.CaptureRequests)
	}
}

// failingStore fails every insert (the engine answers 503 unavailable),
// and KeyNotify too when notifyFails is set, like a database in trouble;
// reads work.
type failingStore struct {
	chargeonce.Store
	notifyFails bool
}

func (failingStore) KeyInsert(context.Context, chargeonce.KeyInsertParams) (chargeonce.KeyRecord, bool, error) {
	return chargeonce.KeyRecord{}, false, errors.New("connection refused")
}

func (f failingStore) KeyNotify(ctx context.Context, merchantID, key string) (bool, error) {
	if f.notifyFails {
		return false, errors.New("connection refused")
	}
	return f.Store.KeyNotify(ctx, merchantID, key)
}

// insertRecord writes the record of an attempt in flight elsewhere for key
// and body's request, under a lease of an hour, and returns it.
func (e *env) insertRecord(key, reqBody string) chargeonce.KeyRecord {
	e.t.Helper()
	req, err := wire.DecodeChargeRequest([]byte(reqBody))
	if err != nil {
		e.t.Fatal(err)
	}
	rec, inserted, err := e.store.KeyInsert(e.t.Context(), chargeonce.KeyInsertParams{
		Fingerprint: idempotency.Fingerprint("POST", "/v1/charges", &req),
		Token:       "tok_elsewhere", Lease: time.Hour,
		Charge: chargeonce.Charge{ID: idempotency.NewChargeID(), MerchantID: merchant, IdempotencyKey: key,
			OrderID: req.OrderID, AmountCents: req.AmountCents, Currency: req.Currency, PaymentToken: req.PaymentToken},
	})
	if err != nil || !inserted {
		e.t.Fatalf("KeyInsert: %v, %v", inserted, err)
	}
	return rec
}

// complete settles rec as captured, as the attempt owning it would.
func (e *env) complete(rec chargeonce.KeyRecord) engine.Response {
	e.t.Helper()
	final := rec.Charge
	final.Status = chargeonce.StatusCaptured
	resp := engine.FinalResponse(&final)
	if err := e.store.KeyComplete(e.t.Context(), chargeonce.KeyCompleteParams{
		MerchantID: merchant, Key: rec.Key, Token: rec.Token,
		ChargeStatus: chargeonce.StatusCaptured, ResponseStatus: resp.Status, ResponseBody: resp.Body, TTL: time.Hour,
	}); err != nil {
		e.t.Fatal(err)
	}
	return resp
}

// TestGivenUpStillAnswered (issue 32.5): requests still failing at their
// last delivery (every insert fails) whose intents have records get their
// answers all the same: a completed record's stored answer is published,
// a processing one's is published by the outbox when it settles. A request
// whose intent has no record gets a final 503 result saying it was given
// up and nothing was kept, beside its dead letter.
func TestGivenUpStillAnswered(t *testing.T) {
	t.Parallel()
	e := setup(t)
	seen := countingSub(t, e.nc)
	done := e.insertRecord("given-up-done", body(91, "tok_ok"))
	stored := e.complete(done)
	held := e.insertRecord("given-up-held", body(92, "tok_ok"))

	eng := engine.New(failingStore{Store: e.store}, e.acq.client(), e.opts)
	w := queue.NewWorker(e.js, eng, e.store, queue.WorkerOptions{MaxDeliver: 2})
	if err := w.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	e.send("given-up-done", body(91, "tok_ok"), "")
	e.send("given-up-held", body(92, "tok_ok"), "")
	e.send("given-up-none", body(93, "tok_ok"), "")
	consumerDrained(t, e.js, queue.DefaultDurable, 20*time.Second)

	if r := seen()["given-up-done"]; len(r) != 1 || r[0].Header.Get(queue.HeaderStatus) != "201" || string(r[0].Data) != string(stored.Body) {
		t.Fatalf("the completed intent's results: %v; want its stored answer", r)
	}
	none := seen()["given-up-none"]
	if len(none) != 1 || none[0].Header.Get(queue.HeaderStatus) != "503" || none[0].Header.Get(queue.HeaderRequestSeq) == "" {
		t.Fatalf("the intent with no record: results %v; want one 503 given up, naming its request", none)
	}
	if p := decodeProblem(t, none[0].Data); p.Type != chargeonce.ProblemTypeBase+chargeonce.EUNAVAILABLE {
		t.Fatalf("the given-up result: %+v", p)
	}
	dead := messages(t, e.js, queue.DeadSubject(merchant))
	if len(dead) != 1 || dead[0].key() != "given-up-none" || dead[0].header.Get(queue.HeaderDeadReason) != "max-deliveries" {
		t.Fatalf("dead letters %v; want one, for given-up-none, max-deliveries", dead)
	}
	if dead[0].header.Get(queue.HeaderRequestSeq) != none[0].Header.Get(queue.HeaderRequestSeq) {
		t.Fatalf("dead letter for request %s, given-up result for %s", dead[0].header.Get(queue.HeaderRequestSeq), none[0].Header.Get(queue.HeaderRequestSeq))
	}

	if r := seen()["given-up-held"]; len(r) != 0 {
		t.Fatalf("published before the attempt in flight settled: %v", r)
	}
	resp := e.complete(held)
	p := queue.NewPublisher(e.store, e.js, queue.PublisherOptions{})
	if n, err := p.RunOnce(t.Context()); err != nil || n != 1 {
		t.Fatalf("publisher: %d, %v; want the held intent's answer from the outbox", n, err)
	}
	if r := seen()["given-up-held"]; len(r) != 1 || string(r[0].Data) != string(resp.Body) {
		t.Fatalf("the held intent's results: %v", r)
	}
}

// TestGivenUpInFlightWhenFlagFails (issue 32.5): a request whose intent is
// in flight elsewhere reaches its last delivery, and the flag for the
// outbox fails. Naking it there would let JetStream drop it unanswered at
// its MaxDeliver; instead it gets a final 503 result saying it was given
// up with its outcome unknown, and a dead letter.
func TestGivenUpInFlightWhenFlagFails(t *testing.T) {
	t.Parallel()
	e := setup(t)
	seen := countingSub(t, e.nc)
	e.insertRecord("flag-fails", body(95, "tok_ok"))
	eng := engine.New(e.store, e.acq.client(), e.opts)
	w := queue.NewWorker(e.js, eng, failingStore{Store: e.store, notifyFails: true}, queue.WorkerOptions{MaxDeliver: 2})
	if err := w.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	e.send("flag-fails", body(95, "tok_ok"), "")
	apitest.Eventually(t, 20*time.Second, "a result", func() bool { return len(seen()["flag-fails"]) > 0 })
	r := seen()["flag-fails"]
	if len(r) != 1 || r[0].Header.Get(queue.HeaderStatus) != "503" {
		t.Fatalf("results %v; want one 503 given up", r)
	}
	seq, _ := strconv.ParseUint(r[0].Header.Get(queue.HeaderRequestSeq), 10, 64)
	if seq == 0 {
		t.Fatalf("the given-up result names no request: %v", r[0].Header)
	}
	consumerDrained(t, e.js, queue.DefaultDurable, 20*time.Second)
	if dead := messages(t, e.js, queue.DeadSubject(merchant)); len(dead) != 1 || dead[0].header.Get(queue.HeaderDeadReason) != "max-deliveries" {
		t.Fatalf("dead letters %v; want one, max-deliveries", dead)
	}
}

func decodeProblem(t *testing.T, b []byte) chargeonce.Problem {
	t.Helper()
	var p chargeonce.Problem
	if err := json.Unmarshal(b, &p); err != nil {
		t.Fatalf("decoding a problem %q: %v", b, err)
	}
	return p
}
