package queue_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/internal/apitest"
	"github.com/chargeonce/chargeonce/internal/natstest"
	"github.com/chargeonce/chargeonce/internal/pgtest"
	"github.com/chargeonce/chargeonce/postgres"
	"github.com/chargeonce/chargeonce/queue"
	"github.com/chargeonce/chargeonce/recovery"
)

func TestMain(m *testing.M) { pgtest.VerifyMain(m) }

// merchant is the demo merchant of apitest's HTTP instances.
const merchant = "demo"

// switchable is an acquirer over HTTP whose outage the test switches on
// and off: while down, every capture answers 503 before reaching the
// simulator (so no money moves).
type switchable struct {
	sim  *acquirer.Simulator
	down atomic.Bool
	srv  *httptest.Server
}

func newSwitchable(t *testing.T) *switchable {
	s := &switchable{sim: apitest.Simulator(t, acquirer.Options{Slow: 50 * time.Millisecond})}
	h := acquirer.Handler(s.sim)
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.down.Load() {
			http.Error(w, "acquirer down", http.StatusServiceUnavailable)
			return
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *switchable) client() chargeonce.Acquirer {
	return acquirer.NewClient(s.srv.URL, &http.Client{Timeout: 10 * time.Second})
}

// env is one test's world: a PostgreSQL schema, a NATS server with both
// streams, an acquirer, and an HTTP instance on the same database.
type env struct {
	t     *testing.T
	store *postgres.Store
	acq   *switchable
	nc    *nats.Conn
	js    jetstream.JetStream
	http  *apitest.Instance
	opts  engine.Options
}

var engineOpts = engine.Options{Lease: 3 * time.Second, AcquirerTimeout: 500 * time.Millisecond}

func setup(t *testing.T) *env {
	t.Helper()
	store := apitest.PostgresStoreAt(t, pgtest.URL(t))
	return setupOn(t, store, natstest.Start(t).URL, 1)
}

func setupOn(t *testing.T, store *postgres.Store, natsURL string, replicas int) *env {
	t.Helper()
	e := &env{t: t, store: store, acq: newSwitchable(t), opts: engineOpts}
	e.js = natstest.JetStream(t, natsURL)
	e.nc = e.js.Conn()
	if err := queue.EnsureStreams(t.Context(), e.js, queue.StreamOptions{Replicas: replicas}); err != nil {
		t.Fatal(err)
	}
	e.http = apitest.Start(t, store, e.acq.client(), e.opts)
	return e
}

// worker starts an in-process worker with its own engine on the env's
// store and acquirer.
func (e *env) worker(opts queue.WorkerOptions) *queue.Worker {
	e.t.Helper()
	eng := engine.New(e.store, e.acq.client(), e.opts)
	w := queue.NewWorker(e.js, eng, e.store, opts)
	if err := w.Start(e.t.Context()); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(w.Stop)
	return w
}

// send publishes a request; msgID may be empty.
func (e *env) send(key, body, msgID string, extra ...string) {
	e.t.Helper()
	m := nats.NewMsg(queue.RequestSubject(merchant))
	if key != "" {
		m.Header.Set(queue.HeaderIdempotencyKey, key)
	}
	for i := 0; i+1 < len(extra); i += 2 {
		m.Header.Add(extra[i], extra[i+1])
	}
	if msgID != "" {
		m.Header.Set(jetstream.MsgIDHeader, msgID)
	}
	m.Data = []byte(body)
	if _, err := e.js.PublishMsg(e.t.Context(), m); err != nil {
		e.t.Fatalf("publishing a request: %v", err)
	}
}

// stored is a message read back from CHARGE_RESULTS.
type stored struct {
	subject string
	header  nats.Header
	body    []byte
}

func (s stored) key() string    { return s.header.Get(queue.HeaderIdempotencyKey) }
func (s stored) status() string { return s.header.Get(queue.HeaderStatus) }

// messages reads every message on subject in the results stream.
func messages(t testing.TB, js jetstream.JetStream, subject string) []stored {
	t.Helper()
	var out []stored
	for _, m := range natstest.ReadAll(t, js, queue.ResultStream, subject) {
		out = append(out, stored{subject: m.Subject, header: m.Header, body: m.Data})
	}
	return out
}

// byKey groups result messages by Idempotency-Key.
func byKey(ms []stored) map[string][]stored {
	g := map[string][]stored{}
	for _, m := range ms {
		g[m.key()] = append(g[m.key()], m)
	}
	return g
}

// waitResults waits until every key has a result and returns them all.
func (e *env) waitResults(d time.Duration, keys ...string) map[string][]stored {
	e.t.Helper()
	return waitResults(e.t, e.js, d, keys...)
}

// waitResults waits until every key has a result on the demo merchant's
// subject and returns them all, grouped by key.
func waitResults(t *testing.T, js jetstream.JetStream, d time.Duration, keys ...string) map[string][]stored {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		g := byKey(messages(t, js, queue.ResultSubject(merchant)))
		missing := 0
		for _, k := range keys {
			if len(g[k]) == 0 {
				missing++
			}
		}
		if missing == 0 {
			return g
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s: %d of %d keys have no result", d, missing, len(keys))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// consumerDrained waits until the durable consumer has nothing pending or
// unacked.
func consumerDrained(t *testing.T, js jetstream.JetStream, durable string, d time.Duration) {
	t.Helper()
	var last *jetstream.ConsumerInfo
	apitest.Eventually(t, d, "the consumer to have nothing pending or unacked", func() bool {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		cons, err := js.Consumer(ctx, queue.RequestStream, durable)
		if err != nil {
			return false
		}
		info, err := cons.Info(ctx)
		if err != nil {
			return false
		}
		last = info
		return info.NumPending == 0 && info.NumAckPending == 0 && info.NumRedelivered == 0
	})
	if last != nil {
		t.Logf("consumer %s: delivered %d, ack floor %d, pending %d, ack pending %d", durable, last.Delivered.Stream, last.AckFloor.Stream, last.NumPending, last.NumAckPending)
	}
}

func body(order int64, token string) string {
	return fmt.Sprintf(`{"order_id": %d, "amount_cents": 2500, "payment_token": %q}`, order, token)
}

// TestQueueAndHTTPShareIntents sends intents once over HTTP and once over
// the queue, both orders: one capture each, and the same bytes both ways.
// A key reused for another request gets HTTP's 422 bytes.
func TestQueueAndHTTPShareIntents(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.worker(queue.WorkerOptions{})

	// HTTP first, then the queue (other field order and whitespace: the
	// same request).
	h := apitest.Charge(t, e.http.URL, "http-first", body(1, "tok_ok"))
	if h.Status != 201 {
		t.Fatalf("HTTP: %d %s", h.Status, h.Body)
	}
	e.send("http-first", `{"payment_token":"tok_ok","amount_cents":2500,"order_id":1}`, "")
	// The queue first, then HTTP; a declined card too.
	e.send("queue-first", body(2, "tok_ok"), "")
	e.send("declined", body(3, "tok_declined"), "")
	g := e.waitResults(20*time.Second, "http-first", "queue-first", "declined")

	q := g["http-first"][0]
	if q.status() != "201" || !bytes.Equal(q.body, h.Body) || q.header.Get(queue.HeaderReplayed) != "true" {
		t.Fatalf("queue after HTTP: %s %q replayed=%q; want 201 with HTTP's bytes %s, replayed", q.status(), q.body, q.header.Get(queue.HeaderReplayed), h.Body)
	}
	for key, order := range map[string]int64{"queue-first": 2, "declined": 3} {
		q := g[key][0]
		token := "tok_ok"
		if key == "declined" {
			token = "tok_declined"
		}
		r := apitest.Charge(t, e.http.URL, key, body(order, token))
		if strconv.Itoa(r.Status) != q.status() || !bytes.Equal(r.Body, q.body) || r.Header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("%s: HTTP after the queue = %d %s; want the queue's %s %s, replayed", key, r.Status, r.Body, q.status(), q.body)
		}
		if q.header.Get(queue.HeaderReplayed) != "" {
			t.Fatalf("%s: the first answer is flagged replayed", key)
		}
		if got := q.header.Get(queue.HeaderContentType); (q.status() == "201") != (got == "application/json") {
			t.Fatalf("%s: Content-Type %q for status %s", key, got, q.status())
		}
	}
	for order := int64(1); order <= 2; order++ {
		if n := e.acq.sim.CapturedCount(merchant, order); n != 1 {
			t.Fatalf("order %d: %d captures, want 1", order, n)
		}
	}

	// The same key for another request: 422, HTTP's bytes.
	e.send("http-first", body(1, "tok_other"), "")
	want := apitest.Charge(t, e.http.URL, "http-first", body(1, "tok_other"))
	var got stored
	apitest.Eventually(t, 20*time.Second, "the 422 result", func() bool {
		for _, m := range byKey(messages(t, e.js, queue.ResultSubject(merchant)))["http-first"] {
			if m.status() == "422" {
				got = m
				return true
			}
		}
		return false
	})
	if want.Status != 422 || !bytes.Equal(got.body, withoutRequestID(want.Body)) {
		t.Fatalf("422: queue %q, HTTP %d %q", got.body, want.Status, want.Body)
	}
	consumerDrained(t, e.js, queue.DefaultDurable, 20*time.Second)
}

// TestPoisonDeadLettered puts poison messages between good ones on a worker
// that handles one message at a time: each poison message gets HTTP's 400
// bytes as its result and a copy on charges.dead, and the good ones behind
// them settle.
func TestPoisonDeadLettered(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.worker(queue.WorkerOptions{Concurrency: 1})

	type poison struct {
		name, key, body, reason string
	}
	poisons := []poison{
		{"no key", "", body(11, "tok_ok"), chargeonce.EMISSINGKEY},
		{"malformed key", "bad key", body(12, "tok_ok"), chargeonce.EINVALIDKEY},
		{"malformed JSON", "p-json", `{"order_id": 13,`, chargeonce.EINVALID},
		{"invalid field", "p-field", `{"order_id": 14, "amount_cents": -5, "payment_token": "tok_ok"}`, chargeonce.EINVALID},
		{"unknown field", "p-unknown", `{"order_id": 15, "amount_cents": 5, "payment_token": "tok_ok", "tip": 1}`, chargeonce.EINVALID},
		{"name in another case", "p-case", `{"order_id": 17, "amount_cents": 25000, "payment_token": "tok_ok", "Amount_Cents": 1}`, chargeonce.EINVALID},
		{"duplicate name", "p-dup", `{"order_id": 18, "amount_cents": 1, "amount_cents": 999999, "payment_token": "tok_ok"}`, chargeonce.EINVALID},
	}
	e.send("good-1", body(10, "tok_ok"), "")
	for _, p := range poisons {
		e.send(p.key, p.body, "")
	}
	e.send("good-2", body(16, "tok_ok"), "")

	g := e.waitResults(20*time.Second, "good-1", "good-2", "p-json", "p-field", "p-unknown", "p-case", "p-dup", "bad key")
	for _, k := range []string{"good-1", "good-2"} {
		if s := g[k][0].status(); s != "201" {
			t.Fatalf("%s: status %s, want 201", k, s)
		}
	}
	var dead []stored
	apitest.Eventually(t, 20*time.Second, "the dead letters", func() bool {
		dead = messages(t, e.js, queue.DeadSubject(merchant))
		return len(dead) == len(poisons)
	})
	all := messages(t, e.js, queue.ResultSubject(merchant))
	for i, p := range poisons {
		want := apitest.Charge(t, e.http.URL, p.key, p.body)
		if want.Status != 400 {
			t.Fatalf("%s: HTTP answers %d", p.name, want.Status)
		}
		var found bool
		for _, m := range all {
			if m.status() == "400" && m.key() == p.key && bytes.Equal(m.body, withoutRequestID(want.Body)) && m.header.Get(queue.HeaderRequestSeq) != "" {
				found = true
			}
		}
		if !found {
			t.Fatalf("%s: no 400 result with HTTP's bytes %s", p.name, want.Body)
		}
		d := dead[i]
		if d.header.Get(queue.HeaderDeadReason) != p.reason || string(d.body) != p.body || d.key() != p.key {
			t.Fatalf("%s: dead letter %v %q; want reason %s and the original message", p.name, d.header, d.body, p.reason)
		}
	}
	consumerDrained(t, e.js, queue.DefaultDurable, 20*time.Second)
}

// countingSub counts every publish on a merchant's result subject,
// duplicates the stream drops included.
func countingSub(t *testing.T, nc *nats.Conn) func() map[string][]*nats.Msg {
	var mu sync.Mutex
	seen := map[string][]*nats.Msg{}
	sub, err := nc.Subscribe(queue.ResultSubject(merchant), func(m *nats.Msg) {
		mu.Lock()
		seen[m.Header.Get(queue.HeaderIdempotencyKey)] = append(seen[m.Header.Get(queue.HeaderIdempotencyKey)], m)
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() }) // fails only once the connection is closed
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return func() map[string][]*nats.Msg {
		mu.Lock()
		defer mu.Unlock()
		out := make(map[string][]*nats.Msg, len(seen))
		for k, v := range seen {
			out[k] = append([]*nats.Msg(nil), v...)
		}
		return out
	}
}

// TestUnknownOutcomeSettledThroughOutbox: tok_fail_after (captured, reply
// lost) and an acquirer outage through the queue. The worker acks each on
// its 202 without a result; recovery, in another instance, settles them
// once the acquirer is back, and the outbox (two publishers) publishes each
// result exactly once.
func TestUnknownOutcomeSettledThroughOutbox(t *testing.T) {
	t.Parallel()
	e := setup(t)
	seen := countingSub(t, e.nc)
	e.worker(queue.WorkerOptions{})

	e.send("fail-after", body(21, "tok_fail_after"), "")
	consumerDrained(t, e.js, queue.DefaultDurable, 20*time.Second)
	e.acq.down.Store(true)
	e.send("outage-1", body(22, "tok_ok"), "")
	e.send("outage-2", body(23, "tok_declined"), "")
	consumerDrained(t, e.js, queue.DefaultDurable, 20*time.Second)
	keys := []string{"fail-after", "outage-1", "outage-2"}
	for _, k := range keys {
		rec, err := e.store.KeyGet(t.Context(), merchant, k)
		if err != nil || rec.State != chargeonce.KeyProcessing {
			t.Fatalf("%s: %+v, %v; want processing", k, rec.State, err)
		}
	}
	if got := seen(); len(got) != 0 {
		t.Fatalf("results published before settlement: %v", got)
	}

	// Recovery runs in the HTTP instance (another engine), like serve's.
	rescuer := recovery.NewRescuer(e.store, e.http.Engine, recovery.RescuerOptions{BackoffBase: 100 * time.Millisecond, BackoffMax: 200 * time.Millisecond})
	time.Sleep(100 * time.Millisecond)
	if _, err := rescuer.RunOnce(t.Context()); err != nil {
		t.Fatal(err)
	}
	if st, err := e.store.OutboxStats(t.Context()); err != nil || st.Count != 0 {
		t.Fatalf("outbox during the outage: %+v, %v", st, err)
	}
	pubs := []*queue.Publisher{
		queue.NewPublisher(e.store, e.js, queue.PublisherOptions{Every: 20 * time.Millisecond}),
		queue.NewPublisher(e.store, e.js, queue.PublisherOptions{Every: 20 * time.Millisecond}),
	}
	for _, p := range pubs {
		p.Start(t.Context())
		t.Cleanup(p.Stop)
	}
	e.acq.down.Store(false)
	apitest.Eventually(t, 20*time.Second, "recovery to settle every record", func() bool {
		if _, err := rescuer.RunOnce(t.Context()); err != nil {
			t.Fatal(err)
		}
		st, err := e.store.KeysStuck(t.Context())
		return err == nil && st.Count == 0
	})
	g := e.waitResults(20*time.Second, keys...)
	apitest.Eventually(t, 10*time.Second, "the outbox to empty", func() bool {
		st, err := e.store.OutboxStats(t.Context())
		return err == nil && st.Count == 0
	})
	time.Sleep(200 * time.Millisecond) // a late second publish would show now
	published := seen()
	for _, k := range keys {
		rec, err := e.store.KeyGet(t.Context(), merchant, k)
		if err != nil || rec.State != chargeonce.KeyCompleted {
			t.Fatalf("%s: %+v, %v", k, rec.State, err)
		}
		if len(g[k]) != 1 || len(published[k]) != 1 {
			t.Fatalf("%s: %d results in the stream, %d published; want exactly 1 each", k, len(g[k]), len(published[k]))
		}
		m := g[k][0]
		if m.status() != strconv.Itoa(rec.ResponseStatus) || !bytes.Equal(m.body, rec.ResponseBody) {
			t.Fatalf("%s: result %s %q, stored %d %q", k, m.status(), m.body, rec.ResponseStatus, rec.ResponseBody)
		}
	}
	if g["fail-after"][0].status() != "201" || g["outage-1"][0].status() != "201" || g["outage-2"][0].status() != "402" {
		t.Fatalf("statuses: %s %s %s", g["fail-after"][0].status(), g["outage-1"][0].status(), g["outage-2"][0].status())
	}
	for _, order := range []int64{21, 22} {
		if n := e.acq.sim.CapturedCount(merchant, order); n != 1 {
			t.Fatalf("order %d: %d captures, want 1", order, n)
		}
	}
	// A late duplicate of a settled request replays the stored answer; the
	// stream keeps one copy (same Nats-Msg-Id).
	e.send("fail-after", body(21, "tok_fail_after"), "")
	apitest.Eventually(t, 10*time.Second, "the replay", func() bool { return len(seen()["fail-after"]) == 2 })
	if r := seen()["fail-after"][1]; r.Header.Get(queue.HeaderReplayed) != "true" || !bytes.Equal(r.Data, g["fail-after"][0].body) {
		t.Fatalf("replay: %v %q", r.Header, r.Data)
	}
	if n := len(byKey(messages(t, e.js, queue.ResultSubject(merchant)))["fail-after"]); n != 1 {
		t.Fatalf("%d results for fail-after in the stream, want 1 (the replay is a duplicate)", n)
	}
}

// raceStore runs before() ahead of every KeyNotify: it lets a test
// complete the record in the window between the engine's 202 and the flag.
type raceStore struct {
	chargeonce.Store
	before func()
}

func (r raceStore) KeyNotify(ctx context.Context, merchantID, key string) (bool, error) {
	r.before()
	return r.Store.KeyNotify(ctx, merchantID, key)
}

// TestSettledBeforeFlag covers the race the flag can lose: recovery
// completes the record between the engine's 202 and KeyNotify, so no outbox
// row is written. The worker must then publish the stored answer itself.
func TestSettledBeforeFlag(t *testing.T) {
	t.Parallel()
	e := setup(t)
	seen := countingSub(t, e.nc)
	rescuer := recovery.NewRescuer(e.store, e.http.Engine, recovery.RescuerOptions{})
	var settled atomic.Int32
	rs := raceStore{Store: e.store, before: func() {
		e.acq.down.Store(false)
		time.Sleep(50 * time.Millisecond) // the unknown outcome's (short) back-off ends
		res, err := rescuer.RunOnce(context.Background())
		if err != nil {
			t.Error(err)
		}
		settled.Add(int32(res.Settled))
	}}
	// The unknown outcome backs the record off before recovery may claim
	// it; a short back-off keeps the race inside the hook.
	opts := e.opts
	opts.BackoffBase, opts.BackoffMax = 20*time.Millisecond, 20*time.Millisecond
	eng := engine.New(e.store, e.acq.client(), opts)
	w := queue.NewWorker(e.js, eng, rs, queue.WorkerOptions{})
	if err := w.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)

	e.acq.down.Store(true)
	e.send("late-flag", body(31, "tok_ok"), "")
	apitest.Eventually(t, 10*time.Second, "the result", func() bool { return len(seen()["late-flag"]) == 1 })
	consumerDrained(t, e.js, queue.DefaultDurable, 10*time.Second)
	if settled.Load() != 1 {
		t.Fatalf("recovery settled %d records in the window, want 1", settled.Load())
	}
	rec, _ := e.store.KeyGet(t.Context(), merchant, "late-flag")
	r := seen()["late-flag"][0]
	if r.Header.Get(queue.HeaderStatus) != "201" || !bytes.Equal(r.Data, rec.ResponseBody) {
		t.Fatalf("result %v %q, stored %q", r.Header, r.Data, rec.ResponseBody)
	}
	if st, err := e.store.OutboxStats(t.Context()); err != nil || st.Count != 0 {
		t.Fatalf("outbox: %+v, %v; want empty (the flag came too late)", st, err)
	}
	if n := e.acq.sim.CapturedCount(merchant, 31); n != 1 {
		t.Fatalf("%d captures, want 1", n)
	}
}

// withoutRequestID is an HTTP problem's bytes without its request_id: a
// result on the queue answers a message, not an HTTP request, and has none;
// the rest of the bytes are the same.
func withoutRequestID(body []byte) []byte {
	return regexp.MustCompile(`,"request_id":"[^"]*"`).ReplaceAll(body, nil)
}
