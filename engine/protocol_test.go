package engine_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/internal/apitest"
)

// TestProtocolTable is the money protocol's table (issue 50): every kind
// of money operation (an automatic charge, a manual charge's authorization,
// a refund, a capture, a cancel) in every situation an attempt can meet,
// through the real HTTP API on loopback, on SQLite. Each cell has a store,
// a simulator and an instance of its own, so the cells run in parallel and
// share nothing. The table below is today's behaviour, written out; where
// kinds disagree, a comment names the disagreement (the engine's redesign
// settles them, and changes the table where it does). The test logs the
// matrix kind × situation: paste it where the table is asked for.
//
// The acquirer is the simulator behind protoAcquirer, which a cell steers
// after its subject is prepared: it holds a call until released (409), it
// fails a call before or after the simulator made it (an unknown outcome:
// what a timeout or a 5xx is to the engine), and it counts the calls that
// move money and the lookups.
func TestProtocolTable(t *testing.T) {
	t.Parallel()
	kinds := protocolKinds()
	situations := []string{"new", "replay", "422", "409", "unknown", "take-over", "over-rate", "unable"}
	want := map[string]map[string]string{
		"charge": {
			"new": "201", "replay": "201 replayed", "422": "422 idempotency-key-reused", "409": "409 request-in-progress",
			"unknown": "202, retry 202, calls 0",
			// Only charges write an attempt trail (issue 50): the retry's
			// claim, its lookup and its outcome are in the charge's history.
			"take-over": "202, retry 201, calls 1, trail 3",
			"over-rate": "retry 201 replayed, new 429 rate-limited",
			"unable":    "201",
		},
		"authorize": {
			"new": "201", "replay": "201 replayed", "422": "422 idempotency-key-reused", "409": "409 request-in-progress",
			"unknown":   "202, retry 202, calls 0",
			"take-over": "202, retry 201, calls 1, trail 3",
			"over-rate": "retry 201 replayed, new 429 rate-limited",
			// "The acquirer cannot do this" disagrees across kinds (issue
			// 50): a manual charge is a 400 on its capture_method field
			// (EINVALID), a refund 503 (EUNAVAILABLE), a capture or a
			// cancel 400 (EINVALID). Nothing is kept for the key in any.
			"unable": "400 validation-failed",
		},
		"refund": {
			"new": "201", "replay": "201 replayed", "422": "422 idempotency-key-reused", "409": "409 request-in-progress",
			"unknown": "202, retry 202, calls 0",
			// No attempt trail for a refund, a capture or a cancel (issue
			// 50): a charge's take-over appends 3 entries, theirs none.
			"take-over": "202, retry 201, calls 1, trail 0",
			"over-rate": "retry 201 replayed, new 429 rate-limited",
			// EUNAVAILABLE where a capture's or a cancel's is EINVALID.
			"unable": "503 unavailable",
		},
		"capture": {
			"new": "200", "replay": "200 replayed", "422": "422 idempotency-key-reused", "409": "409 request-in-progress",
			"unknown":   "202, retry 202, calls 0",
			"take-over": "202, retry 200, calls 1, trail 0",
			"over-rate": "retry 200 replayed, new 429 rate-limited",
			"unable":    "400 validation-failed",
		},
		"cancel": {
			// A cancel has no body: its 422 is the same key on another
			// charge's cancel.
			"new": "200", "replay": "200 replayed", "422": "422 idempotency-key-reused", "409": "409 request-in-progress",
			"unknown":   "202, retry 202, calls 0",
			"take-over": "202, retry 200, calls 1, trail 0",
			"over-rate": "retry 200 replayed, new 429 rate-limited",
			"unable":    "400 validation-failed",
		},
	}

	var mu sync.Mutex
	got := map[string]map[string]string{}
	t.Run("cells", func(t *testing.T) {
		for _, k := range kinds {
			for _, s := range situations {
				t.Run(k.name+"/"+s, func(t *testing.T) {
					t.Parallel()
					g := protocolSituations[s](t, k)
					mu.Lock()
					if got[k.name] == nil {
						got[k.name] = map[string]string{}
					}
					got[k.name][s] = g
					mu.Unlock()
					if w := want[k.name][s]; g != w {
						t.Errorf("%s, %s: %q; the table says %q", k.name, s, g, w)
					}
				})
			}
		}
	})
	t.Log("the protocol table, kind × situation (SQLite, over HTTP):\n" + protocolMatrix(kinds, situations, got))
}

// protocolMatrix renders got as a Markdown table, a row per kind.
func protocolMatrix(kinds []protocolKind, situations []string, got map[string]map[string]string) string {
	var b strings.Builder
	b.WriteString("| kind | " + strings.Join(situations, " | ") + " |\n|---" + strings.Repeat("|---", len(situations)) + "|\n")
	for _, k := range kinds {
		b.WriteString("| " + k.name)
		for _, s := range situations {
			g, ok := got[k.name][s]
			if !ok {
				g = "(not run)"
			}
			b.WriteString(" | " + g)
		}
		b.WriteString(" |\n")
	}
	return b.String()
}

// protocolKind is one kind of money operation: how its subject is made
// (nothing for a charge; a captured charge for a refund; an authorization
// for a capture or a cancel) and how its request is sent.
type protocolKind struct {
	name    string
	newCode int
	// prepare makes the cell's subject through base, with the acquirer
	// answering.
	prepare func(t *testing.T, c *protocolCell, base string)
	// send sends the cell's request with key to base; other sends another
	// request under it (another body; for a cancel, another charge).
	send func(t *testing.T, c *protocolCell, base, key string, other bool) apitest.Result
}

func protocolKinds() []protocolKind {
	chargeSend := func(manual string) func(t *testing.T, c *protocolCell, base, key string, other bool) apitest.Result {
		return func(t *testing.T, c *protocolCell, base, key string, other bool) apitest.Result {
			amount := 5000
			if other {
				amount = 4999
			}
			return apitest.Charge(t, base, key, fmt.Sprintf(`{"order_id": %d, "amount_cents": %d, "currency": "BRL", "payment_token": "tok_ok"%s}`, c.order, amount, manual))
		}
	}
	noSubject := func(t *testing.T, c *protocolCell, base string) {}
	authorized := func(t *testing.T, c *protocolCell, base string) {
		c.subject = c.charge(t, base, true)
		c.otherSubject = c.charge(t, base, true)
	}
	opSend := func(verb, body, otherBody string) func(t *testing.T, c *protocolCell, base, key string, other bool) apitest.Result {
		return func(t *testing.T, c *protocolCell, base, key string, other bool) apitest.Result {
			id, b := c.subject, body
			if other {
				b = otherBody
				if verb == "cancel" {
					id = c.otherSubject
				}
			}
			return protocolPost(t, base, "/v1/charges/"+id+"/"+verb, key, b)
		}
	}
	return []protocolKind{
		{name: "charge", newCode: 201, prepare: noSubject, send: chargeSend("")},
		{name: "authorize", newCode: 201, prepare: noSubject, send: chargeSend(`, "capture_method": "manual"`)},
		{name: "refund", newCode: 201, prepare: func(t *testing.T, c *protocolCell, base string) {
			c.subject = c.charge(t, base, false)
		}, send: opSend("refunds", `{"amount_cents": 1000}`, `{"amount_cents": 999}`)},
		{name: "capture", newCode: 200, prepare: authorized, send: opSend("capture", `{"amount_cents": 3000}`, `{"amount_cents": 2999}`)},
		{name: "cancel", newCode: 200, prepare: authorized, send: opSend("cancel", "", "")},
	}
}

// protocolSeq numbers the orders and keys of the table's charges.
var protocolSeq atomic.Int64

func init() { protocolSeq.Store(time.Now().UnixNano() % 1e9 * 1000) }

// protocolPost posts body (none when empty) to path under base with the
// Idempotency-Key key.
func protocolPost(t *testing.T, base, path, key, body string) apitest.Result {
	t.Helper()
	var b []byte
	if body != "" {
		b = []byte(body)
	}
	r, err := apitest.Do(t, nil, "POST", base+path, b, map[string]string{"Idempotency-Key": key})
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	return r
}

// protocolCell is one cell's world: a fresh SQLite store, a simulator
// behind protoAcquirer, and the instance the situation drives.
type protocolCell struct {
	acq          *protoAcquirer
	store        chargeonce.Store
	inst         *apitest.Instance
	history      *countingHistory
	order        int64
	subject      string // the charge a refund, capture or cancel is of
	otherSubject string // another authorization (a cancel's 422)
}

// protocolOptions are every cell's engine options: an acquirer call held
// by a cell is never cut off by the acquirer timeout, and an unknown
// outcome rests for an hour (no retry in the test gets past its back-off),
// unless the cell says otherwise.
func protocolOptions(h *countingHistory) engine.Options {
	return engine.Options{AcquirerTimeout: time.Minute, BackoffBase: time.Hour, BackoffMax: time.Hour, History: h}
}

func newProtocolCell(t *testing.T, k protocolKind, opts func(*engine.Options)) *protocolCell {
	t.Helper()
	c := &protocolCell{
		store:   apitest.Store(t, "sqlite"),
		acq:     &protoAcquirer{sim: apitest.Simulator(t, acquirer.Options{}), entered: make(chan struct{}, 1), release: make(chan struct{})},
		history: &countingHistory{},
		order:   protocolSeq.Add(1),
	}
	o := protocolOptions(c.history)
	if opts != nil {
		opts(&o)
	}
	c.inst = apitest.Start(t, c.store, c.acq, o)
	k.prepare(t, c, c.inst.URL)
	// The counts are the situation's own.
	c.acq.calls.Store(0)
	c.acq.lookups.Store(0)
	c.history.n.Store(0)
	return c
}

// charge makes a charge (authorized when manual) for a subject, failing
// the test unless it is 201 at once.
func (c *protocolCell) charge(t *testing.T, base string, manual bool) string {
	t.Helper()
	m := ""
	if manual {
		m = `, "capture_method": "manual"`
	}
	r := apitest.Charge(t, base, fmt.Sprintf("subject-%d", protocolSeq.Add(1)),
		fmt.Sprintf(`{"order_id": %d, "amount_cents": 5000, "currency": "BRL", "payment_token": "tok_ok"%s}`, protocolSeq.Add(1), m))
	var ch struct {
		ID string `json:"id"`
	}
	if r.Status != 201 || json.Unmarshal(r.Body, &ch) != nil || ch.ID == "" {
		t.Fatalf("preparing the subject: %d %s", r.Status, r.Body)
	}
	return ch.ID
}

// describe is an answer as the table shows it: the status, and a
// problem's slug.
func describe(t *testing.T, r apitest.Result) string {
	t.Helper()
	if r.Status < 400 {
		return fmt.Sprint(r.Status)
	}
	var p struct {
		Type   string `json:"type"`
		Title  string `json:"title"`
		Status int    `json:"status"`
	}
	if ct := r.Header.Get("Content-Type"); ct != "application/problem+json" {
		t.Errorf("a %d with Content-Type %q; want application/problem+json: %s", r.Status, ct, r.Body)
	}
	if err := json.Unmarshal(r.Body, &p); err != nil || p.Status != r.Status || p.Title == "" {
		t.Errorf("a %d whose problem does not say so: %s", r.Status, r.Body)
	}
	return fmt.Sprintf("%d %s", r.Status, p.Type[strings.LastIndex(p.Type, "/")+1:])
}

// protocolSituations drive one cell each and return what the table shows
// for it; the invariants behind the cell (byte-identical replays, the
// acquirer's counts) are checked on the way.
var protocolSituations = map[string]func(t *testing.T, k protocolKind) string{
	"new": func(t *testing.T, k protocolKind) string {
		c := newProtocolCell(t, k, nil)
		r := k.send(t, c, c.inst.URL, "k", false)
		if r.Header.Get("Idempotent-Replayed") != "" {
			t.Errorf("a new attempt says it is replayed: %q", r.Header.Get("Idempotent-Replayed"))
		}
		if n := c.acq.calls.Load(); n != 1 {
			t.Errorf("a new attempt made %d acquirer calls; want 1", n)
		}
		return describe(t, r)
	},
	"replay": func(t *testing.T, k protocolKind) string {
		c := newProtocolCell(t, k, nil)
		first := k.send(t, c, c.inst.URL, "k", false)
		if first.Status != k.newCode {
			t.Fatalf("the first attempt: %d %s", first.Status, first.Body)
		}
		r := k.send(t, c, c.inst.URL, "k", false)
		if !bytes.Equal(r.Body, first.Body) || r.Status != first.Status {
			t.Errorf("the replay: %d %s; want the first answer byte for byte: %d %s", r.Status, r.Body, first.Status, first.Body)
		}
		if n := c.acq.calls.Load(); n != 1 {
			t.Errorf("new and replay made %d acquirer calls; want 1", n)
		}
		return replayed(r)
	},
	"422": func(t *testing.T, k protocolKind) string {
		c := newProtocolCell(t, k, nil)
		if first := k.send(t, c, c.inst.URL, "k", false); first.Status != k.newCode {
			t.Fatalf("the first attempt: %d %s", first.Status, first.Body)
		}
		r := k.send(t, c, c.inst.URL, "k", true)
		if n := c.acq.calls.Load(); n != 1 {
			t.Errorf("new and key reuse made %d acquirer calls; want 1", n)
		}
		return describe(t, r)
	},
	"409": func(t *testing.T, k protocolKind) string {
		c := newProtocolCell(t, k, nil)
		c.acq.setMode(modeHold)
		first := make(chan apitest.Result, 1)
		// Released however the cell ends, before its server closes
		// (which waits for the held request).
		var once sync.Once
		release := func() { once.Do(func() { close(c.acq.release) }) }
		t.Cleanup(release)
		go func() {
			// A send that fails the test ends this goroutine: the zero
			// result still reaches the cell.
			var r apitest.Result
			defer func() { first <- r }()
			r = k.send(t, c, c.inst.URL, "k", false)
		}()
		select {
		case <-c.acq.entered:
		case <-time.After(time.Minute):
			t.Fatal("the first attempt never reached the acquirer")
		}
		r := k.send(t, c, c.inst.URL, "k", false)
		release()
		if f := <-first; f.Status != k.newCode {
			t.Errorf("the held attempt, released: %d %s; want %d", f.Status, f.Body, k.newCode)
		}
		if n := c.acq.calls.Load(); n != 1 {
			t.Errorf("the held attempt and its retry made %d acquirer calls; want 1", n)
		}
		return describe(t, r)
	},
	"unknown": func(t *testing.T, k protocolKind) string {
		c := newProtocolCell(t, k, nil)
		c.acq.setMode(modeFailBefore)
		r := k.send(t, c, c.inst.URL, "k", false)
		if r.Status == 202 && r.Header.Get("Retry-After") == "" {
			t.Errorf("the unknown outcome's 202 has no Retry-After")
		}
		c.acq.setMode(modeOK)
		// The retry inside the back-off (an hour) is answered 202 without
		// an acquirer call.
		again := k.send(t, c, c.inst.URL, "k", false)
		return fmt.Sprintf("%s, retry %s, calls %d", describe(t, r), describe(t, again), c.acq.calls.Load())
	},
	"take-over": func(t *testing.T, k protocolKind) string {
		// The first attempt's call reaches the simulator, which moves the
		// money, and its answer is lost: 202, and the record rests for a
		// millisecond's back-off, its lease over. The retry claims it,
		// looks the reference up and settles it from what the acquirer
		// holds: one call in all.
		c := newProtocolCell(t, k, func(o *engine.Options) { o.BackoffBase, o.BackoffMax = time.Millisecond, time.Millisecond })
		c.acq.setMode(modeFailAfter)
		r := k.send(t, c, c.inst.URL, "k", false)
		c.acq.setMode(modeOK)
		var final apitest.Result
		apitest.Eventually(t, 10*time.Second, "a retry settling the record", func() bool {
			final = k.send(t, c, c.inst.URL, "k", false)
			return final.Status != 202
		})
		if final.Header.Get("Idempotent-Replayed") != "" {
			t.Errorf("the retry that settled the record says it is replayed")
		}
		if again := k.send(t, c, c.inst.URL, "k", false); !bytes.Equal(again.Body, final.Body) || again.Header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("the replay after the take-over: %d %s; want %s replayed", again.Status, again.Body, final.Body)
		}
		if c.acq.lookups.Load() == 0 {
			t.Errorf("the take-over settled the record without a lookup")
		}
		return fmt.Sprintf("%s, retry %s, calls %d, trail %d", describe(t, r), describe(t, final), c.acq.calls.Load(), c.history.n.Load())
	},
	"over-rate": func(t *testing.T, k protocolKind) string {
		// Another instance over the same store and acquirer, whose rate
		// is one token, then one an hour; its replay cache has never seen
		// the key.
		c := newProtocolCell(t, k, nil)
		first := k.send(t, c, c.inst.URL, "k", false)
		if first.Status != k.newCode {
			t.Fatalf("the first attempt: %d %s", first.Status, first.Body)
		}
		o := protocolOptions(c.history)
		o.MerchantRate = engine.Rate{PerSecond: 1.0 / 3600, Burst: 1}
		other := apitest.Start(t, c.store, c.acq, o)
		if r := apitest.Charge(t, other.URL, "spend", fmt.Sprintf(`{"order_id": %d, "amount_cents": 5000, "currency": "BRL", "payment_token": "tok_ok"}`, protocolSeq.Add(1))); r.Status != 201 {
			t.Fatalf("spending the other instance's token: %d %s", r.Status, r.Body)
		}
		calls := c.acq.calls.Load()
		retry := k.send(t, c, other.URL, "k", false)
		if !bytes.Equal(retry.Body, first.Body) {
			t.Errorf("the retry over the rate: %d %s; want the stored %s", retry.Status, retry.Body, first.Body)
		}
		fresh := k.send(t, c, other.URL, "k-new", false)
		if n := c.acq.calls.Load(); n != calls {
			t.Errorf("attempts over the rate made %d acquirer calls", n-calls)
		}
		return fmt.Sprintf("retry %s, new %s", replayed(retry), describe(t, fresh))
	},
	"unable": func(t *testing.T, k protocolKind) string {
		// Another instance over the same store whose acquirer captures and
		// looks up, and nothing else: no authorizations, captures of
		// them, voids or refunds. The subject was made through the first.
		c := newProtocolCell(t, k, nil)
		other := apitest.Start(t, c.store, plainAcquirer{c.acq}, protocolOptions(c.history))
		r := k.send(t, c, other.URL, "k", false)
		if r.Status >= 400 {
			// Nothing was kept: the same key through an acquirer that
			// can is a new attempt.
			if again := k.send(t, c, c.inst.URL, "k", false); again.Status != k.newCode || again.Header.Get("Idempotent-Replayed") != "" {
				t.Errorf("the key refused for the acquirer, then through one that can: %d %s; want a new %d", again.Status, again.Body, k.newCode)
			}
		}
		return describe(t, r)
	},
}

// replayed describes a replay: its status, and "replayed" when it says so.
func replayed(r apitest.Result) string {
	s := fmt.Sprint(r.Status)
	if r.Header.Get("Idempotent-Replayed") == "true" {
		s += " replayed"
	}
	return s
}

type protoMode int32

const (
	modeOK         protoMode = iota
	modeHold                 // wait for release before calling the simulator
	modeFailBefore           // fail without calling the simulator: a 5xx
	modeFailAfter            // call the simulator, then lose its answer: a timeout
)

var errProtoAcquirer = errors.New("protoAcquirer: 503 Service Unavailable")

// protoAcquirer is the simulator, every capability of it the engine uses,
// with its calls that move money steered by mode and counted.
type protoAcquirer struct {
	sim     *acquirer.Simulator
	mode    atomic.Int32
	entered chan struct{}
	release chan struct{}
	calls   atomic.Int64 // calls that reached the simulator and move money
	lookups atomic.Int64
}

func (a *protoAcquirer) setMode(m protoMode) { a.mode.Store(int32(m)) }

// call runs do, one call that moves money, as the mode says.
func call[R any](ctx context.Context, a *protoAcquirer, do func() (R, error)) (R, error) {
	var zero R
	switch protoMode(a.mode.Load()) {
	case modeHold:
		select {
		case a.entered <- struct{}{}:
		default:
		}
		select {
		case <-a.release:
		case <-ctx.Done():
			return zero, ctx.Err()
		}
	case modeFailBefore:
		return zero, errProtoAcquirer
	case modeFailAfter:
		a.calls.Add(1)
		if _, err := do(); err != nil {
			return zero, err
		}
		return zero, errProtoAcquirer
	}
	a.calls.Add(1)
	return do()
}

func (a *protoAcquirer) Capture(ctx context.Context, req chargeonce.CaptureRequest) (chargeonce.CaptureResult, error) {
	return call(ctx, a, func() (chargeonce.CaptureResult, error) { return a.sim.Capture(ctx, req) })
}

func (a *protoAcquirer) Authorize(ctx context.Context, req chargeonce.CaptureRequest) (chargeonce.CaptureResult, error) {
	return call(ctx, a, func() (chargeonce.CaptureResult, error) { return a.sim.Authorize(ctx, req) })
}

func (a *protoAcquirer) CaptureAuthorized(ctx context.Context, req chargeonce.OperationCall) (chargeonce.OperationResult, error) {
	return call(ctx, a, func() (chargeonce.OperationResult, error) { return a.sim.CaptureAuthorized(ctx, req) })
}

func (a *protoAcquirer) Void(ctx context.Context, req chargeonce.OperationCall) (chargeonce.OperationResult, error) {
	return call(ctx, a, func() (chargeonce.OperationResult, error) { return a.sim.Void(ctx, req) })
}

func (a *protoAcquirer) Refund(ctx context.Context, req chargeonce.RefundCall) (chargeonce.RefundResult, error) {
	return call(ctx, a, func() (chargeonce.RefundResult, error) { return a.sim.Refund(ctx, req) })
}

func (a *protoAcquirer) Lookup(ctx context.Context, req chargeonce.LookupRequest) (chargeonce.LookupResult, error) {
	a.lookups.Add(1)
	return a.sim.Lookup(ctx, req)
}

func (a *protoAcquirer) OperationLookup(ctx context.Context, req chargeonce.LookupRequest) (chargeonce.LookupResult, error) {
	a.lookups.Add(1)
	return a.sim.OperationLookup(ctx, req)
}

func (a *protoAcquirer) RefundLookup(ctx context.Context, req chargeonce.LookupRequest) (chargeonce.LookupResult, error) {
	a.lookups.Add(1)
	return a.sim.RefundLookup(ctx, req)
}

// plainAcquirer has the capabilities every acquirer has, capture and
// lookup, and no other.
type plainAcquirer struct{ a *protoAcquirer }

func (p plainAcquirer) Capture(ctx context.Context, req chargeonce.CaptureRequest) (chargeonce.CaptureResult, error) {
	return p.a.Capture(ctx, req)
}

func (p plainAcquirer) Lookup(ctx context.Context, req chargeonce.LookupRequest) (chargeonce.LookupResult, error) {
	return p.a.Lookup(ctx, req)
}

// countingHistory counts the history entries the engine appends (the
// attempt trail).
type countingHistory struct{ n atomic.Int64 }

func (h *countingHistory) HistoryAppend(_ context.Context, entries ...chargeonce.HistoryEntry) error {
	h.n.Add(int64(len(entries)))
	return nil
}

var (
	_ chargeonce.ManualCapturer  = (*protoAcquirer)(nil)
	_ chargeonce.Refunder        = (*protoAcquirer)(nil)
	_ chargeonce.HistoryAppender = (*countingHistory)(nil)
)
