package queue_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/internal/apitest"
	"github.com/chargeonce/chargeonce/internal/natstest"
	"github.com/chargeonce/chargeonce/queue"
	"github.com/chargeonce/chargeonce/recovery"
)

// opEngineOpts leave the acquirer far more time than a capture takes on a
// loaded machine, so that every capture here settles at once (an unknown
// outcome, left to recovery, is the refunds' outbox test's business).
var opEngineOpts = engine.Options{Lease: 10 * time.Second, AcquirerTimeout: 10 * time.Second}

// opEnv is one test's world on either store: the store, a NATS server with
// both streams, the acquirer, and an HTTP instance on the same store.
type opEnv struct {
	t     *testing.T
	store chargeonce.Store
	acq   *switchable
	nc    *nats.Conn
	js    jetstream.JetStream
	http  *apitest.Instance
}

func setupStore(t *testing.T, kind string) *opEnv {
	t.Helper()
	e := &opEnv{t: t, store: apitest.Store(t, kind), acq: newSwitchable(t)}
	e.js = natstest.JetStream(t, natstest.Start(t).URL)
	e.nc = e.js.Conn()
	if err := queue.EnsureStreams(t.Context(), e.js, queue.StreamOptions{}); err != nil {
		t.Fatal(err)
	}
	e.http = apitest.Start(t, e.store, e.acq.client(), opEngineOpts)
	return e
}

// newWorker returns a worker with its own engine on the env's store and
// acquirer, not started.
func (e *opEnv) newWorker(opts queue.WorkerOptions) *queue.Worker {
	return queue.NewWorker(e.js, engine.New(e.store, e.acq.client(), opEngineOpts), e.store, opts)
}

// worker starts a worker; stopped at cleanup.
func (e *opEnv) worker(opts queue.WorkerOptions) {
	e.t.Helper()
	w := e.newWorker(opts)
	if err := w.Start(e.t.Context()); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(w.Stop)
}

// send publishes a request with key (none when empty), body and the extra
// headers, given as name, value pairs.
func (e *opEnv) send(key, body string, headers ...string) {
	e.t.Helper()
	m := nats.NewMsg(queue.RequestSubject(merchant))
	if key != "" {
		m.Header.Set(queue.HeaderIdempotencyKey, key)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		m.Header.Add(headers[i], headers[i+1])
	}
	m.Data = []byte(body)
	if _, err := e.js.PublishMsg(e.t.Context(), m); err != nil {
		e.t.Fatalf("publishing a request: %v", err)
	}
}

// authorized makes a manual charge of 2500 over HTTP and returns its id.
func (e *opEnv) authorized(key string, order int64) string {
	e.t.Helper()
	r := apitest.Charge(e.t, e.http.URL, key, fmt.Sprintf(`{"order_id": %d, "amount_cents": 2500, "payment_token": "tok_ok", "capture_method": "manual"}`, order))
	var ch struct{ ID, Status string }
	if err := json.Unmarshal(r.Body, &ch); err != nil || r.Status != 201 || ch.Status != "authorized" {
		e.t.Fatalf("authorizing %s: %d %s", key, r.Status, r.Body)
	}
	return ch.ID
}

// overHTTP posts op ("capture" or "cancel") of chargeID with key and body.
func (e *opEnv) overHTTP(op, chargeID, key, body string) apitest.Result {
	e.t.Helper()
	r, err := apitest.Do(e.t, nil, "POST", e.http.URL+"/v1/charges/"+chargeID+"/"+op, []byte(body), map[string]string{"Idempotency-Key": key})
	if err != nil {
		e.t.Fatal(err)
	}
	return r
}

// TestQueueCaptureAndCancel: a request carrying Chargeonce-Capture-Of or
// Chargeonce-Cancel-Of is a capture or a cancel of that authorization
// through the engine, sharing keys, records and answer bytes with POST
// /v1/charges/{id}/capture and /cancel both ways; a key used for another
// request gets HTTP's 422 bytes. A request the charge's state refuses (not
// authorized, a capture past the authorization, no such charge) gets
// HTTP's problem bytes as this message's result and is acked at its first
// delivery; a malformed one (two operation headers, a bad amount, a body
// a cancel does not take) is poison: its 400 is published and it is
// dead-lettered. Nothing is redelivered. On both stores.
func TestQueueCaptureAndCancel(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"postgres", "sqlite"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			e := setupStore(t, kind)
			e.worker(queue.WorkerOptions{})
			toCapture, toCancel, httpFirst := e.authorized("op-auth-1", 101), e.authorized("op-auth-2", 102), e.authorized("op-auth-3", 103)

			e.send("cp-a", `{"amount_cents":1500}`, queue.HeaderCaptureOf, toCapture)
			e.send("vd-a", ``, queue.HeaderCancelOf, toCancel)
			h := e.overHTTP("capture", httpFirst, "cp-http", `{}`)
			if h.Status != 200 {
				t.Fatalf("capture over HTTP: %d %s", h.Status, h.Body)
			}
			e.send("cp-http", ` `, queue.HeaderCaptureOf, httpFirst)
			g := waitResults(t, e.js, 30*time.Second, "cp-a", "vd-a", "cp-http")

			var ch struct {
				ID, Status     string
				CapturedAmount int64 `json:"amount_captured_cents"`
			}
			a := g["cp-a"][0]
			if err := json.Unmarshal(a.body, &ch); err != nil || a.status() != "200" || ch.ID != toCapture || ch.Status != "captured" || ch.CapturedAmount != 1500 || a.header.Get(queue.HeaderReplayed) != "" {
				t.Fatalf("capture over the queue: %s %s; want 200, %s captured 1500, not replayed", a.status(), a.body, toCapture)
			}
			v := g["vd-a"][0]
			if err := json.Unmarshal(v.body, &ch); err != nil || v.status() != "200" || ch.ID != toCancel || ch.Status != "canceled" {
				t.Fatalf("cancel over the queue: %s %s; want 200, %s canceled", v.status(), v.body, toCancel)
			}
			// The queue's answers are HTTP's stored answers, both ways.
			for _, c := range []struct {
				op, charge, key, body string
				queued                stored
			}{{"capture", toCapture, "cp-a", `{"amount_cents":1500}`, a}, {"cancel", toCancel, "vd-a", `{}`, v}} {
				if r := e.overHTTP(c.op, c.charge, c.key, c.body); r.Status != 200 || !bytes.Equal(r.Body, c.queued.body) || r.Header.Get("Idempotent-Replayed") != "true" {
					t.Fatalf("%s over HTTP after the queue: %d %s; want the queue's bytes %s, replayed", c.op, r.Status, r.Body, c.queued.body)
				}
			}
			if q := g["cp-http"][0]; q.status() != "200" || !bytes.Equal(q.body, h.Body) || q.header.Get(queue.HeaderReplayed) != "true" {
				t.Fatalf("the queue after HTTP: %s %s; want HTTP's bytes %s, replayed", q.status(), q.body, h.Body)
			}

			// Refused for this message, nothing kept: HTTP's bytes. A
			// capture past the authorization, of a captured charge, of an
			// automatic charge, of no charge; a cancel of a captured
			// charge. And the key of a capture, reused for a cancel: 422.
			more := e.authorized("op-auth-4", 104)
			automatic := apitest.Charge(t, e.http.URL, "op-auto", body(105, "tok_ok"))
			var auto struct{ ID string }
			if err := json.Unmarshal(automatic.Body, &auto); err != nil || automatic.Status != 201 {
				t.Fatalf("an automatic charge: %d %s", automatic.Status, automatic.Body)
			}
			refusals := []struct {
				key, op, header, charge, body, status, slug string
			}{
				{"cp-more", "capture", queue.HeaderCaptureOf, more, `{"amount_cents":2501}`, "400", chargeonce.ECAPTUREEXCEEDS},
				{"cp-again", "capture", queue.HeaderCaptureOf, toCapture, `{}`, "400", chargeonce.ENOTAUTHORIZED},
				{"cp-auto", "capture", queue.HeaderCaptureOf, auto.ID, ``, "400", chargeonce.ENOTAUTHORIZED},
				{"cp-none", "capture", queue.HeaderCaptureOf, "ch_nope", ``, "404", chargeonce.ENOTFOUND},
				{"vd-captured", "cancel", queue.HeaderCancelOf, toCapture, ``, "400", chargeonce.ENOTAUTHORIZED},
				{"cp-a", "cancel", queue.HeaderCancelOf, toCapture, ``, "422", chargeonce.EKEYREUSED},
			}
			// Poison: never answerable, dead-lettered.
			poisons := []struct {
				key, body string
				headers   []string
				field     string
			}{
				{"op-both", `{}`, []string{queue.HeaderCaptureOf, more, queue.HeaderCancelOf, more}, queue.HeaderCancelOf},
				{"op-refund-capture", `{}`, []string{queue.HeaderRefundOf, more, queue.HeaderCaptureOf, more}, queue.HeaderCaptureOf},
				{"cp-two", `{}`, []string{queue.HeaderCaptureOf, more, queue.HeaderCaptureOf, more}, queue.HeaderCaptureOf},
				{"cp-badid", `{}`, []string{queue.HeaderCaptureOf, "ch nope"}, queue.HeaderCaptureOf},
				{"cp-negative", `{"amount_cents":-5}`, []string{queue.HeaderCaptureOf, more}, "amount_cents"},
				{"cp-string", `{"amount_cents":"5"}`, []string{queue.HeaderCaptureOf, more}, "amount_cents"},
				{"vd-amount", `{"amount_cents":5}`, []string{queue.HeaderCancelOf, more}, "amount_cents"},
			}
			e.send("cp-huge", `{"amount_cents":1`+strings.Repeat(" ", 70<<10)+`}`, queue.HeaderCaptureOf, more)
			keys := []string{"cp-huge"}
			for _, r := range refusals {
				keys = append(keys, r.key)
				e.send(r.key, r.body, r.header, r.charge)
			}
			for _, p := range poisons {
				keys = append(keys, p.key)
				e.send(p.key, p.body, p.headers...)
			}
			waitResults(t, e.js, 30*time.Second, keys...)
			consumerDrained(t, e.js, queue.DefaultDurable, 20*time.Second)
			g = byKey(messages(t, e.js, queue.ResultSubject(merchant)))
			for _, r := range refusals {
				var got *stored
				for i, m := range g[r.key] {
					if m.status() == r.status {
						got = &g[r.key][i]
					}
				}
				if got == nil || got.header.Get(queue.HeaderRequestSeq) == "" {
					t.Errorf("%s: results %v; want %s %s for this message", r.key, g[r.key], r.status, r.slug)
					continue
				}
				want := e.overHTTP(r.op, r.charge, r.key, r.body)
				if fmt.Sprint(want.Status) != r.status || !bytes.Equal(got.body, withoutRequestID(want.Body)) || !strings.Contains(string(got.body), r.slug) {
					t.Errorf("%s: the queue answers %s %s; HTTP %d %s; want %s %s, the same bytes", r.key, got.status(), got.body, want.Status, want.Body, r.status, r.slug)
				}
			}
			if r := g["cp-more"]; len(r) == 0 || !strings.Contains(string(r[0].body), "authorized: 2500 BRL") {
				t.Errorf("the refused capture does not name what was authorized: %v", r)
			}
			for _, p := range poisons {
				r := g[p.key]
				if len(r) != 1 || r[0].status() != "400" || !strings.Contains(string(r[0].body), chargeonce.EINVALID) || !strings.Contains(string(r[0].body), `"field":"`+p.field+`"`) {
					t.Errorf("%s: %v; want one 400 validation-failed naming %s", p.key, r, p.field)
				}
			}
			if r := g["cp-huge"]; len(r) != 1 || r[0].status() != "413" || !strings.Contains(string(r[0].body), chargeonce.ETOOLARGE) {
				t.Errorf("cp-huge: %v; want one 413 payload-too-large", r)
			}
			if dead := messages(t, e.js, queue.DeadSubject(merchant)); len(dead) != len(poisons)+1 {
				t.Errorf("%d requests dead-lettered; want the %d malformed ones", len(dead), len(poisons)+1)
			}

			// The acquirer: one capture of 1500 of the first, a void of
			// the second, the whole of the third, nothing of the fourth.
			for _, c := range []struct {
				charge   string
				captured int64
				voided   bool
			}{{toCapture, 1500, false}, {toCancel, 0, true}, {httpFirst, 2500, false}, {more, 0, false}} {
				if captured, voided := e.acq.sim.Authorization(c.charge); captured != c.captured || voided != c.voided {
					t.Errorf("%s at the acquirer: captured %d, voided %v; want %d, %v", c.charge, captured, voided, c.captured, c.voided)
				}
			}
			if st := e.acq.sim.Stats(); st.AuthorizationCaptures != 2 || st.Voids != 1 {
				t.Errorf("the acquirer's stats: %+v; want 2 captures of authorizations and 1 void", st)
			}
		})
	}
}

// lostAck is a delivery whose ack never reaches JetStream, as when the
// worker dies between the result's publish and its ack.
type lostAck struct{ jetstream.Msg }

func (lostAck) Ack() error { return nil }

// TestQueueCaptureRedeliveryReplays: a capture message handled, its ack
// lost, is redelivered by JetStream after AckWait; the redelivery publishes
// the first answer again byte for byte, flagged replayed, and the
// acquirer captured once. On both stores.
func TestQueueCaptureRedeliveryReplays(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"postgres", "sqlite"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			e := setupStore(t, kind)
			seen := countingSub(t, e.nc)
			w := e.newWorker(queue.WorkerOptions{})
			cons, err := e.js.CreateOrUpdateConsumer(t.Context(), queue.RequestStream, jetstream.ConsumerConfig{
				Durable: "redelivery", AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Second, MaxDeliver: 5,
			})
			if err != nil {
				t.Fatal(err)
			}
			ch := e.authorized("rd-auth", 201)
			e.send("rd-capture", `{"amount_cents":2000}`, queue.HeaderCaptureOf, ch)
			next := func() jetstream.Msg {
				t.Helper()
				batch, err := cons.Fetch(1, jetstream.FetchMaxWait(10*time.Second))
				if err != nil {
					t.Fatal(err)
				}
				for m := range batch.Messages() {
					return m
				}
				t.Fatalf("no delivery: %v", batch.Error())
				return nil
			}
			first := next()
			w.Handle(t.Context(), lostAck{first})
			again := next()
			if md, err := again.Metadata(); err != nil || md.NumDelivered != 2 || md.Sequence.Stream != streamSeqOf(t, first) {
				t.Fatalf("the second delivery: %+v, %v; want the same message, delivered twice", md, err)
			}
			w.Handle(t.Context(), again)
			apitest.Eventually(t, 10*time.Second, "both answers", func() bool { return len(seen()["rd-capture"]) == 2 })
			got := seen()["rd-capture"]
			if got[0].Header.Get(queue.HeaderStatus) != "200" || got[0].Header.Get(queue.HeaderReplayed) != "" {
				t.Fatalf("the first answer: %v %s; want 200, not replayed", got[0].Header, got[0].Data)
			}
			if got[1].Header.Get(queue.HeaderStatus) != "200" || !bytes.Equal(got[1].Data, got[0].Data) || got[1].Header.Get(queue.HeaderReplayed) != "true" {
				t.Fatalf("the redelivery's answer: %v %s; want the first bytes %s, replayed", got[1].Header, got[1].Data, got[0].Data)
			}
			if got[1].Header.Get(jetstream.MsgIDHeader) != got[0].Header.Get(jetstream.MsgIDHeader) {
				t.Fatalf("the replay's Nats-Msg-Id differs: the results stream would keep two copies")
			}
			if captured, _ := e.acq.sim.Authorization(ch); captured != 2000 || e.acq.sim.Stats().AuthorizationCaptures != 1 {
				t.Fatalf("the acquirer captured %d (%d captures); want 2000 once", captured, e.acq.sim.Stats().AuthorizationCaptures)
			}
		})
	}
}

func streamSeqOf(t *testing.T, m jetstream.Msg) uint64 {
	t.Helper()
	md, err := m.Metadata()
	if err != nil {
		t.Fatal(err)
	}
	return md.Sequence.Stream
}

// outcomes counts the worker's outcomes.
type outcomes struct {
	mu sync.Mutex
	n  map[string]int
}

func (o *outcomes) Message(outcome string, _ bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.n == nil {
		o.n = map[string]int{}
	}
	o.n[outcome]++
}
func (*outcomes) DeadLetter(string)                  {}
func (*outcomes) Outbox(chargeonce.OutboxStats, int) {}

func (o *outcomes) count(outcome string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.n[outcome]
}

// gatedCapturer holds every capture of an authorization at the acquirer
// until gate is closed.
type gatedCapturer struct {
	*acquirer.Client
	gate chan struct{}
}

func (g gatedCapturer) CaptureAuthorized(ctx context.Context, req chargeonce.OperationCall) (chargeonce.OperationResult, error) {
	select {
	case <-g.gate:
	case <-ctx.Done():
		return chargeonce.OperationResult{}, ctx.Err()
	}
	return g.Client.CaptureAuthorized(ctx, req)
}

// TestQueueCaptureRace: four workers, each with its own engine, on one
// database, race 24 copies of one capture message (one key). The capture
// that wins the insert is held at the acquirer until every other copy has
// found it in flight (409: naked, redelivered later); then it settles, and
// the redeliveries replay it. Every copy is answered 200 with the same
// bytes, exactly one of them not a replay, and the acquirer captured once:
// its stats count one capture of an authorization and its ledger one
// capture entry for the charge. On both stores.
func TestQueueCaptureRace(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"postgres", "sqlite"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			e := setupStore(t, kind)
			seen := countingSub(t, e.nc)
			obs := &outcomes{}
			gate := make(chan struct{})
			for range 4 {
				acq := gatedCapturer{Client: acquirer.NewClient(e.acq.srv.URL, &http.Client{Timeout: 10 * time.Second}), gate: gate}
				w := queue.NewWorker(e.js, engine.New(e.store, acq, opEngineOpts), e.store, queue.WorkerOptions{Concurrency: 8, Observer: obs})
				if err := w.Start(t.Context()); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(w.Stop)
			}
			ch := e.authorized("race-auth", 301)
			start := time.Now()
			const copies = 24
			for range copies {
				e.send("race-capture", `{"amount_cents":2400}`, queue.HeaderCaptureOf, ch)
			}
			// Held well within the acquirer timeout (10 s), so that the
			// capture settles rather than becoming an unknown outcome.
			deadline := time.Now().Add(7 * time.Second)
			for obs.count(queue.OutcomeInProgress) < copies-1 && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			inFlight := obs.count(queue.OutcomeInProgress)
			close(gate)
			if inFlight < copies-1 {
				t.Errorf("%d copies found the capture in flight while it was held; want all %d others", inFlight, copies-1)
			}
			apitest.Eventually(t, 60*time.Second, "every copy answered", func() bool { return len(seen()["race-capture"]) >= copies })
			consumerDrained(t, e.js, queue.DefaultDurable, 30*time.Second)
			t.Logf("%d copies answered in %s; %d answers 409 in flight, %d replayed, %d answered",
				copies, time.Since(start), obs.count(queue.OutcomeInProgress), obs.count(queue.OutcomeReplayed), obs.count(queue.OutcomeAnswered))
			got := seen()["race-capture"]
			if len(got) != copies {
				t.Errorf("%d answers for %d copies; want one each", len(got), copies)
			}
			first := 0
			for _, m := range got {
				if m.Header.Get(queue.HeaderStatus) != "200" || !bytes.Equal(m.Data, got[0].Data) {
					t.Fatalf("an answer %v %s differs from %s", m.Header, m.Data, got[0].Data)
				}
				if m.Header.Get(queue.HeaderReplayed) == "" {
					first++
				}
			}
			if first != 1 {
				t.Errorf("%d answers not replayed; want exactly one (the capture's)", first)
			}
			st := e.acq.sim.Stats()
			if st.AuthorizationCaptures != 1 {
				t.Errorf("the acquirer counts %d captures of authorizations; want 1 (stats %+v)", st.AuthorizationCaptures, st)
			}
			if captured, voided := e.acq.sim.Authorization(ch); captured != 2400 || voided {
				t.Errorf("the authorization at the acquirer: captured %d, voided %v; want 2400", captured, voided)
			}
			page, err := e.acq.sim.LedgerList(t.Context(), chargeonce.LedgerParams{From: start.Add(-time.Hour), To: time.Now().Add(time.Hour)})
			if err != nil {
				t.Fatal(err)
			}
			captures := 0
			for _, le := range page.Entries {
				// A capture of an authorization is listed as such, under
				// the charge's reference (docs/reconciliation.md).
				if le.Kind == chargeonce.LedgerManualCapture && le.ChargeReference == ch {
					captures++
					if le.AmountCents != 2400 {
						t.Errorf("the ledger's capture: %d cents; want 2400", le.AmountCents)
					}
				}
			}
			if captures != 1 || page.Next != "" {
				t.Errorf("the ledger lists %d captures of %s; want 1 (%+v)", captures, ch, page.Entries)
			}
			var charge struct {
				Status         string
				CapturedAmount int64 `json:"amount_captured_cents"`
			}
			g, err := apitest.Do(t, nil, "GET", e.http.URL+"/v1/charges/"+ch, nil, nil)
			if err != nil || json.Unmarshal(g.Body, &charge) != nil || charge.Status != "captured" || charge.CapturedAmount != 2400 {
				t.Errorf("the charge: %v %s; want captured 2400", err, g.Body)
			}
		})
	}
}

// TestQueueCaptureSettledThroughOutbox: a capture and a cancel whose
// acquirer calls fail (an outage) are acked pending, with no result; once
// recovery has settled them, the outbox publishes each stored answer
// exactly once, as for a charge or a refund. On both stores.
func TestQueueCaptureSettledThroughOutbox(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"postgres", "sqlite"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			e := setupStore(t, kind)
			seen := countingSub(t, e.nc)
			e.worker(queue.WorkerOptions{})
			toCapture, toCancel := e.authorized("ob-auth-1", 401), e.authorized("ob-auth-2", 402)

			e.acq.down.Store(true)
			e.send("ob-capture", `{}`, queue.HeaderCaptureOf, toCapture)
			e.send("ob-cancel", `{}`, queue.HeaderCancelOf, toCancel)
			consumerDrained(t, e.js, queue.DefaultDurable, 20*time.Second)
			keys := []string{"ob-capture", "ob-cancel"}
			for _, k := range keys {
				if rec, err := e.store.KeyGet(t.Context(), merchant, k); err != nil || rec.State != chargeonce.KeyProcessing || rec.Operation == nil {
					t.Fatalf("%s: %+v, %v; want an operation processing", k, rec.State, err)
				}
			}
			if got := seen(); len(got) != 0 {
				t.Fatalf("results published before settlement: %v", got)
			}
			p := queue.NewPublisher(e.store, e.js, queue.PublisherOptions{Every: 20 * time.Millisecond})
			p.Start(t.Context())
			t.Cleanup(p.Stop)
			rescuer := recovery.NewRescuer(e.store, e.http.Engine, recovery.RescuerOptions{BackoffBase: 100 * time.Millisecond, BackoffMax: 200 * time.Millisecond})
			e.acq.down.Store(false)
			apitest.Eventually(t, 30*time.Second, "recovery to settle both", func() bool {
				if _, err := rescuer.RunOnce(t.Context()); err != nil {
					t.Fatal(err)
				}
				st, err := e.store.KeysStuck(t.Context())
				return err == nil && st.Count == 0
			})
			g := waitResults(t, e.js, 20*time.Second, keys...)
			time.Sleep(200 * time.Millisecond) // a late second publish would show now
			for _, k := range keys {
				rec, err := e.store.KeyGet(t.Context(), merchant, k)
				if err != nil || rec.State != chargeonce.KeyCompleted {
					t.Fatalf("%s: %+v, %v", k, rec.State, err)
				}
				if r := g[k]; len(r) != 1 || len(seen()[k]) != 1 || r[0].status() != "200" || !bytes.Equal(r[0].body, rec.ResponseBody) {
					t.Fatalf("%s: results %v; want exactly one, the stored 200 %s", k, r, rec.ResponseBody)
				}
			}
			if captured, _ := e.acq.sim.Authorization(toCapture); captured != 2500 {
				t.Errorf("the acquirer captured %d; want 2500", captured)
			}
			if _, voided := e.acq.sim.Authorization(toCancel); !voided {
				t.Errorf("the acquirer did not void %s", toCancel)
			}
		})
	}
}
