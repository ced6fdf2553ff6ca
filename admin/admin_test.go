package admin_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/admin"
	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/internal/apitest"
	"github.com/chargeonce/chargeonce/internal/pgtest"
	"github.com/chargeonce/chargeonce/postgres"
)

func TestMain(m *testing.M) {
	pgtest.VerifyMain(m)
}

func sha256hex(s string) string {
	d := sha256.Sum256([]byte(s))
	return hex.EncodeToString(d[:])
}

func newLogger(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// The admin keys of the tests: alice's is given as its digest, as a keys
// file holds it.
const (
	aliceKey = "ak_test_alice"
	bobKey   = "ak_test_bob"
)

func adminKeys(t *testing.T) *admin.Keys {
	t.Helper()
	k, err := admin.ParseKeys("# operators\nalice:sha256:" + sha256hex(aliceKey) + "\nbob:" + bobKey + "\n")
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// downAcquirer counts capture requests per reference and, while down,
// answers like an acquirer that cannot be reached.
type downAcquirer struct {
	next        chargeonce.Acquirer
	down        atomic.Bool
	loseRefunds atomic.Bool
	// loseOperations: the acquirer captures or voids an authorization,
	// and its answer is lost on the way back.
	loseOperations atomic.Bool
	// loseAuthorizations: the acquirer authorizes a manual charge, and
	// its answer is lost on the way back.
	loseAuthorizations atomic.Bool
	mu                 sync.Mutex
	sent               map[string]int
	// hold, when positive, is how long a proxy holds each refund, capture
	// or void before it delivers it: the caller's timeout ends its wait,
	// not the request, which lands later (SPEC "Finality"). held waits
	// for the requests still held.
	hold atomic.Int64
	held sync.WaitGroup
}

// deliver sends a request on through send, or, with hold set, after the
// hold on a goroutine of its own whatever the caller does.
func deliver[T any](ctx context.Context, a *downAcquirer, send func(context.Context) (T, error)) (T, error) {
	d := time.Duration(a.hold.Load())
	if d <= 0 {
		return send(ctx)
	}
	type answer struct {
		v   T
		err error
	}
	done := make(chan answer, 1)
	a.held.Go(func() {
		time.Sleep(d)
		v, err := send(context.WithoutCancel(ctx))
		done <- answer{v, err}
	})
	select {
	case r := <-done:
		return r.v, r.err
	case <-ctx.Done():
		var zero T
		return zero, ctx.Err()
	}
}

func (a *downAcquirer) Capture(ctx context.Context, req chargeonce.CaptureRequest) (chargeonce.CaptureResult, error) {
	a.mu.Lock()
	a.sent[req.Reference]++
	a.mu.Unlock()
	if a.down.Load() {
		return chargeonce.CaptureResult{}, errors.New("dial tcp 127.0.0.1:9: connect: connection refused")
	}
	return a.next.Capture(ctx, req)
}

func (a *downAcquirer) Lookup(ctx context.Context, req chargeonce.LookupRequest) (chargeonce.LookupResult, error) {
	if a.down.Load() {
		return chargeonce.LookupResult{}, errors.New("dial tcp 127.0.0.1:9: connect: connection refused")
	}
	return a.next.Lookup(ctx, req)
}

// Refund sends the refund on, unless down; with loseRefunds set, the
// acquirer refunds and its answer is lost on the way back.
func (a *downAcquirer) Refund(ctx context.Context, req chargeonce.RefundCall) (chargeonce.RefundResult, error) {
	if a.down.Load() {
		return chargeonce.RefundResult{}, errors.New("dial tcp 127.0.0.1:9: connect: connection refused")
	}
	res, err := deliver(ctx, a, func(ctx context.Context) (chargeonce.RefundResult, error) {
		return a.next.(chargeonce.Refunder).Refund(ctx, req)
	})
	if err == nil && a.loseRefunds.Load() {
		return chargeonce.RefundResult{}, errors.New("read tcp 127.0.0.1:51234->127.0.0.1:8082: connection reset by peer")
	}
	return res, err
}

func (a *downAcquirer) RefundLookup(ctx context.Context, req chargeonce.LookupRequest) (chargeonce.LookupResult, error) {
	if a.down.Load() {
		return chargeonce.LookupResult{}, errors.New("dial tcp 127.0.0.1:9: connect: connection refused")
	}
	return a.next.(chargeonce.Refunder).RefundLookup(ctx, req)
}

// Authorize sends the authorization on, unless down, counted as a
// capture of the charge's reference; with loseAuthorizations set, the
// acquirer authorizes and its answer is lost.
func (a *downAcquirer) Authorize(ctx context.Context, req chargeonce.CaptureRequest) (chargeonce.CaptureResult, error) {
	a.mu.Lock()
	a.sent[req.Reference]++
	a.mu.Unlock()
	if a.down.Load() {
		return chargeonce.CaptureResult{}, errors.New("dial tcp 127.0.0.1:9: connect: connection refused")
	}
	res, err := a.next.(chargeonce.ManualCapturer).Authorize(ctx, req)
	if err == nil && a.loseAuthorizations.Load() {
		return chargeonce.CaptureResult{}, errors.New("read tcp 127.0.0.1:51238->127.0.0.1:8082: connection reset by peer")
	}
	return res, err
}

// CaptureAuthorized sends the capture on, counted per operation
// reference, unless down; with loseOperations set, the acquirer captures
// and its answer is lost.
func (a *downAcquirer) CaptureAuthorized(ctx context.Context, req chargeonce.OperationCall) (chargeonce.OperationResult, error) {
	return a.operation(ctx, req, a.next.(chargeonce.ManualCapturer).CaptureAuthorized)
}

// Void is CaptureAuthorized for a void.
func (a *downAcquirer) Void(ctx context.Context, req chargeonce.OperationCall) (chargeonce.OperationResult, error) {
	return a.operation(ctx, req, a.next.(chargeonce.ManualCapturer).Void)
}

func (a *downAcquirer) operation(ctx context.Context, req chargeonce.OperationCall,
	send func(context.Context, chargeonce.OperationCall) (chargeonce.OperationResult, error),
) (chargeonce.OperationResult, error) {
	a.mu.Lock()
	a.sent[req.Reference]++
	a.mu.Unlock()
	if a.down.Load() {
		return chargeonce.OperationResult{}, errors.New("dial tcp 127.0.0.1:9: connect: connection refused")
	}
	res, err := deliver(ctx, a, func(ctx context.Context) (chargeonce.OperationResult, error) { return send(ctx, req) })
	if err == nil && a.loseOperations.Load() {
		return chargeonce.OperationResult{}, errors.New("read tcp 127.0.0.1:51236->127.0.0.1:8082: connection reset by peer")
	}
	return res, err
}

func (a *downAcquirer) OperationLookup(ctx context.Context, req chargeonce.LookupRequest) (chargeonce.LookupResult, error) {
	if a.down.Load() {
		return chargeonce.LookupResult{}, errors.New("dial tcp 127.0.0.1:9: connect: connection refused")
	}
	return a.next.(chargeonce.ManualCapturer).OperationLookup(ctx, req)
}

// env is a merchant API and an admin API over one store and acquirer.
type env struct {
	store  chargeonce.Store
	sim    *acquirer.Simulator
	acq    *downAcquirer
	api    *apitest.Instance
	admin  *httptest.Server
	logs   *apitest.Buffer
	orders atomic.Int64
}

// testOptions are the engine's options in the tests: a stuck charge is
// backed off for an hour, so that nothing but the test drives it again.
var testOptions = engine.Options{Lease: 2 * time.Second, AcquirerTimeout: time.Second, BackoffBase: time.Hour, BackoffMax: time.Hour}

func setup(t *testing.T, kind string) *env {
	t.Helper()
	return setupWith(t, kind, testOptions)
}

func setupWith(t *testing.T, kind string, opts engine.Options) *env {
	t.Helper()
	return setupSim(t, kind, opts, acquirer.Options{Slow: 50 * time.Millisecond})
}

func setupSim(t *testing.T, kind string, opts engine.Options, simOpts acquirer.Options) *env {
	t.Helper()
	e := &env{store: apitest.Store(t, kind), logs: &apitest.Buffer{}}
	e.orders.Store(time.Now().UnixNano() % 1e9 * 1000)
	e.sim = apitest.Simulator(t, simOpts)
	e.acq = &downAcquirer{next: e.sim, sent: map[string]int{}}
	e.api = apitest.Start(t, e.store, e.acq, opts)
	srv, err := admin.New(admin.Config{
		Store: e.store, Acquirer: e.acq, Finality: e.sim, Keys: adminKeys(t), Lease: opts.Lease, AcquirerTimeout: opts.AcquirerTimeout,
		Logger: newLogger(e.logs),
	})
	if err != nil {
		t.Fatal(err)
	}
	e.admin = httptest.NewServer(srv)
	t.Cleanup(e.admin.Close)
	return e
}

// stuck charges a new order while the acquirer is down: the answer is 202
// and the charge stays processing, backed off for an hour.
func (e *env) stuck(t *testing.T, key string) (chargeID string, body string) {
	t.Helper()
	e.acq.down.Store(true)
	defer e.acq.down.Store(false)
	body = fmt.Sprintf(`{"order_id":%d,"amount_cents":2500,"payment_token":"tok_ok"}`, e.orders.Add(1))
	r := apitest.Charge(t, e.api.URL, key, body)
	if r.Status != 202 {
		t.Fatalf("charge with the acquirer down: %d %s, want 202", r.Status, r.Body)
	}
	var ch struct{ ID string }
	if err := json.Unmarshal(r.Body, &ch); err != nil || ch.ID == "" {
		t.Fatalf("202 body %s: %v", r.Body, err)
	}
	return ch.ID, body
}

// call sends an admin API request with key.
func (e *env) call(t *testing.T, method, path, key string, body any) (int, []byte) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(t.Context(), method, e.admin.URL+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

func problemType(b []byte) string {
	var p chargeonce.Problem
	_ = json.Unmarshal(b, &p)
	return strings.TrimPrefix(p.Type, chargeonce.ProblemTypeBase)
}

func TestAdminKeysNeverCross(t *testing.T) {
	t.Parallel()
	e := setup(t, "sqlite")
	for _, key := range []string{"", apitest.APIKey, "ak_test_nobody"} {
		if st, b := e.call(t, "GET", "/admin/v1/charges", key, nil); st != 401 || problemType(b) != chargeonce.EUNAUTHORIZED {
			t.Errorf("admin API with key %q: %d %s, want 401", key, st, b)
		}
	}
	// An admin key is not a merchant's key.
	r, err := apitest.Do(t, nil, "GET", e.api.URL+"/v1/charges", nil, map[string]string{"Authorization": "Bearer " + aliceKey})
	if err != nil || r.Status != 401 {
		t.Errorf("merchant API with an admin key: %d %s (%v), want 401", r.Status, r.Body, err)
	}
	if st, _ := e.call(t, "GET", "/admin/v1/charges", aliceKey, nil); st != 200 {
		t.Errorf("admin API with alice's key: %d", st)
	}
	if logs := e.logs.String(); !strings.Contains(logs, "admin=alice") || !strings.Contains(logs, "admin=- ") {
		t.Errorf("admin calls are not logged with the admin's name:\n%s", logs)
	}
	if strings.Contains(e.logs.String(), aliceKey) {
		t.Error("an admin key reached the log")
	}
}

// TestStuckListAndHistory: a charge whose capture failed is listed with its
// age, attempts, last error and next attempt; its history shows the
// failed capture; a charge on the common path is not listed, and its
// history is derived from the record with no row written.
func TestStuckListAndHistory(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"postgres", "sqlite"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			e := setup(t, kind)
			stuckID, _ := e.stuck(t, "stuck-1")
			ok := apitest.Charge(t, e.api.URL, "fine-1", fmt.Sprintf(`{"order_id":%d,"amount_cents":100,"payment_token":"tok_ok"}`, e.orders.Add(1)))
			if ok.Status != 201 {
				t.Fatalf("common path: %d %s", ok.Status, ok.Body)
			}
			var okCharge struct{ ID string }
			_ = json.Unmarshal(ok.Body, &okCharge)

			st, b := e.call(t, "GET", "/admin/v1/charges?status=processing&older_than=0s", aliceKey, nil)
			if st != 200 {
				t.Fatalf("stuck list: %d %s", st, b)
			}
			var list struct {
				Data []admin.StuckJSON
			}
			if err := json.Unmarshal(b, &list); err != nil {
				t.Fatal(err)
			}
			if len(list.Data) != 1 || list.Data[0].ID != stuckID {
				t.Fatalf("stuck list = %s, want only %s", b, stuckID)
			}
			row := list.Data[0]
			if row.AcquirerAttempts != 1 || row.LastOutcome == nil || row.LastOutcome.Kind != chargeonce.HistoryCapture ||
				!strings.Contains(row.LastOutcome.Detail, "connection refused") || time.Until(row.NextAttemptAt) < 30*time.Minute ||
				row.Merchant != "demo" || row.KeyHash == "" || strings.Contains(string(b), "stuck-1") || strings.Contains(string(b), "tok_ok") {
				t.Fatalf("stuck row = %s", b)
			}
			if st, b := e.call(t, "GET", "/admin/v1/charges?older_than=1h", aliceKey, nil); st != 200 || strings.Contains(string(b), stuckID) {
				t.Fatalf("older_than=1h: %d %s", st, b)
			}
			for _, q := range []string{"status=captured", "older_than=soon", "limit=0", "after=ch_nope"} {
				if st, b := e.call(t, "GET", "/admin/v1/charges?"+q, aliceKey, nil); st != 400 || problemType(b) != chargeonce.EINVALID {
					t.Errorf("?%s: %d %s, want 400", q, st, b)
				}
			}

			st, b = e.call(t, "GET", "/admin/v1/charges/"+stuckID, aliceKey, nil)
			var d admin.ChargeDetailJSON
			if st != 200 || json.Unmarshal(b, &d) != nil {
				t.Fatalf("charge detail: %d %s", st, b)
			}
			if kinds := historyKinds(d.History); kinds != "inserted capture" || d.Record == nil || d.Record.State != chargeonce.KeyProcessing {
				t.Fatalf("history of the stuck charge: %s (%s)", kinds, b)
			}
			st, b = e.call(t, "GET", "/admin/v1/charges/"+okCharge.ID, aliceKey, nil)
			if st != 200 || json.Unmarshal(b, &d) != nil {
				t.Fatalf("charge detail: %d %s", st, b)
			}
			if kinds := historyKinds(d.History); kinds != "inserted capture settled" {
				t.Fatalf("history of a charge on the common path: %s", kinds)
			}
			for _, h := range d.History {
				if !h.Derived {
					t.Fatalf("the common path wrote a history row: %+v", h)
				}
			}
			if st, b := e.call(t, "GET", "/admin/v1/charges/ch_nope", aliceKey, nil); st != 404 {
				t.Errorf("unknown charge: %d %s", st, b)
			}
		})
	}
}

func historyKinds(h []admin.EntryJSON) string {
	var ks []string
	for _, e := range h {
		ks = append(ks, string(e.Kind))
	}
	return strings.Join(ks, " ")
}

// TestResolve: the resolution looks the reference up first; a capture the
// acquirer holds refuses "declined" (409 acquirer-disagrees) unless forced;
// a resolved charge is no longer processing (409); the merchant's retry
// replays the resolved answer, and the audit trail has one entry.
func TestResolve(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"postgres", "sqlite"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			e := setup(t, kind)
			// Captured at the acquirer, reply lost: the charge stays
			// processing, but the acquirer holds the capture.
			body := fmt.Sprintf(`{"order_id":%d,"amount_cents":900,"payment_token":"tok_fail_after"}`, e.orders.Add(1))
			r := apitest.Charge(t, e.api.URL, "lost-reply", body)
			if r.Status != 202 {
				t.Fatalf("tok_fail_after: %d %s", r.Status, r.Body)
			}
			var ch struct{ ID string }
			_ = json.Unmarshal(r.Body, &ch)
			path := "/admin/v1/charges/" + ch.ID + "/resolve"

			for _, bad := range []any{
				map[string]any{"status": "refunded", "reason": "x"},
				map[string]any{"status": "declined"},
				map[string]any{"status": "captured", "reason": "x", "decline_code": "nope"},
				map[string]any{"status": "captured", "reason": "x", "extra": 1},
			} {
				if st, b := e.call(t, "POST", path, bobKey, bad); st != 400 {
					t.Errorf("resolve %v: %d %s, want 400", bad, st, b)
				}
			}
			st, b := e.call(t, "POST", path, bobKey, admin.ResolveRequest{Status: chargeonce.StatusDeclined, Reason: "support says no"})
			if st != 409 || problemType(b) != chargeonce.EDISAGREES || !strings.Contains(string(b), "found: captured") {
				t.Fatalf("declining a captured charge: %d %s, want 409 acquirer-disagrees", st, b)
			}
			_, b = e.call(t, "GET", "/admin/v1/charges/"+ch.ID, bobKey, nil)
			var d admin.ChargeDetailJSON
			_ = json.Unmarshal(b, &d)
			if d.Charge.Status != chargeonce.StatusProcessing || !strings.Contains(historyKinds(d.History), "resolve-refused") {
				t.Fatalf("after a refused resolution: %s", b)
			}
			// Money the acquirer says moved is never settled as none, even
			// forced (SPEC "Finality"): the refusal binds.
			st, b = e.call(t, "POST", path, bobKey, admin.ResolveRequest{Status: chargeonce.StatusDeclined, DeclineCode: "fraud_suspected", Reason: "refunded by hand, ticket 42", Force: true})
			if st != 409 || problemType(b) != chargeonce.EDISAGREES || !strings.Contains(string(b), "whatever force says") {
				t.Fatalf("forced decline of a charge the acquirer captured: %d %s, want 409 %s that force cannot override", st, b, chargeonce.EDISAGREES)
			}
			st, b = e.call(t, "POST", path, bobKey, admin.ResolveRequest{Status: chargeonce.StatusCaptured, Reason: "the acquirer captured it, ticket 42"})
			if st != 200 {
				t.Fatalf("resolution as the acquirer says: %d %s", st, b)
			}
			var res struct {
				Charge admin.ChargeJSON
				Audit  admin.EntryJSON
			}
			_ = json.Unmarshal(b, &res)
			if res.Charge.Status != chargeonce.StatusCaptured || res.Audit.Forced ||
				res.Audit.Actor != "admin:bob" || !strings.Contains(res.Audit.Detail, "found: captured") {
				t.Fatalf("resolution answered %s", b)
			}
			if st, b := e.call(t, "POST", path, aliceKey, admin.ResolveRequest{Status: chargeonce.StatusCaptured, Reason: "again"}); st != 409 || problemType(b) != chargeonce.ENOTPROCESSING {
				t.Fatalf("resolving a settled charge: %d %s, want 409 charge-not-processing", st, b)
			}
			// The merchant's retry replays the resolved answer.
			r = apitest.Charge(t, e.api.URL, "lost-reply", body)
			if r.Status != 201 || r.Header.Get("Idempotent-Replayed") != "true" || !strings.Contains(string(r.Body), `"status":"captured"`) {
				t.Fatalf("retry after the resolution: %d %s %v", r.Status, r.Body, r.Header)
			}
			st, b = e.call(t, "GET", "/admin/v1/audit", aliceKey, nil)
			var audit struct{ Data []admin.EntryJSON }
			// The resolution, and before it the refused ones (issue 34:
			// refused resolutions belong in the trail too).
			if st != 200 || json.Unmarshal(b, &audit) != nil || len(audit.Data) != 3 || audit.Data[0].Reason != "the acquirer captured it, ticket 42" ||
				audit.Data[1].Kind != chargeonce.HistoryResolveRefused || audit.Data[1].Reason != "refunded by hand, ticket 42" ||
				audit.Data[2].Kind != chargeonce.HistoryResolveRefused || audit.Data[2].Reason != "support says no" {
				t.Fatalf("audit trail: %d %s", st, b)
			}
			// The resolve answer carries the audit entry as stored.
			if a := audit.Data[0]; res.Audit.ID == 0 || res.Audit.ID != a.ID || !res.Audit.At.Equal(a.At) {
				t.Fatalf("the resolve answered the audit entry id %d at %v; the trail holds id %d at %v", res.Audit.ID, res.Audit.At, a.ID, a.At)
			}
			if n := e.acq.captures(ch.ID); n != 1 {
				t.Fatalf("capture requests for %s: %d, want 1 (resolutions only look up)", ch.ID, n)
			}
		})
	}
}

// TestResolveNeverOverridesACaptureInFlight: a slow capture (3 s at the
// simulator, 1 s acquirer timeout) is resolved "declined" while it is
// under way. While the attempt holds its lease the resolution is refused
// with nothing changed; once the attempt gave up (202, backed off), a
// lookup that times out refuses it too; and once the capture landed, the
// acquirer's capture refuses it. The charge ends captured, captured once.
func TestResolveNeverOverridesACaptureInFlight(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"postgres", "sqlite"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			e := setupSim(t, kind, testOptions, acquirer.Options{Slow: 3 * time.Second})
			body := fmt.Sprintf(`{"order_id":%d,"amount_cents":900,"payment_token":"tok_slow"}`, e.orders.Add(1))
			sent := time.Now()
			answered := make(chan apitest.Result, 1)
			go func() { answered <- apitest.Charge(t, e.api.URL, "slow", body) }()
			var id string
			apitest.Eventually(t, 2*time.Second, "the slow charge is inserted", func() bool {
				page, err := e.store.(chargeonce.OperatorStore).ChargesListStuck(t.Context(), chargeonce.StuckListParams{Limit: 10, IncludeLeased: true})
				if err != nil || len(page.Charges) != 1 {
					return false
				}
				id = page.Charges[0].Charge.ID
				return true
			})
			path := "/admin/v1/charges/" + id + "/resolve"
			decline := admin.ResolveRequest{Status: chargeonce.StatusDeclined, Reason: "support says it failed"}

			time.Sleep(time.Until(sent.Add(300 * time.Millisecond)))
			st, b := e.call(t, "POST", path, bobKey, decline)
			if st != 409 || problemType(b) != chargeonce.ELEASED {
				t.Fatalf("resolving 0.3 s into the attempt's capture: %d %s, want 409 %s", st, b, chargeonce.ELEASED)
			}
			// Forcing changes nothing while a lease is live.
			forced := decline
			forced.Force = true
			if st, b := e.call(t, "POST", path, bobKey, forced); st != 409 || problemType(b) != chargeonce.ELEASED {
				t.Fatalf("forcing 0.3 s into the attempt's capture: %d %s, want 409 %s", st, b, chargeonce.ELEASED)
			}

			if r := <-answered; r.Status != 202 {
				t.Fatalf("the slow charge answered %d %s, want 202 after the acquirer timeout", r.Status, r.Body)
			}
			// The attempt let go (backed off); the capture is still under
			// way at the simulator, so the lookup times out.
			st, b = e.call(t, "POST", path, bobKey, decline)
			if st != 409 || problemType(b) != chargeonce.EUNSURE {
				t.Fatalf("resolving while the capture is under way: %d %s, want 409 %s", st, b, chargeonce.EUNSURE)
			}

			time.Sleep(time.Until(sent.Add(3500 * time.Millisecond)))
			st, b = e.call(t, "POST", path, bobKey, decline)
			if st != 409 || problemType(b) != chargeonce.EDISAGREES {
				t.Fatalf("declining once the capture landed: %d %s, want 409 %s", st, b, chargeonce.EDISAGREES)
			}
			st, b = e.call(t, "POST", path, bobKey, admin.ResolveRequest{Status: chargeonce.StatusCaptured, Reason: "the acquirer captured it"})
			if st != 200 {
				t.Fatalf("resolving as the acquirer says: %d %s", st, b)
			}
			var res struct{ Audit admin.EntryJSON }
			if json.Unmarshal(b, &res) != nil || res.Audit.Forced || !strings.Contains(res.Audit.Detail, "found: captured") {
				t.Fatalf("resolution answered %s, want an unforced audit entry quoting the capture", b)
			}
			if r := apitest.Charge(t, e.api.URL, "slow", body); r.Status != 201 {
				t.Fatalf("the retry after the resolution: %d %s, want the captured 201", r.Status, r.Body)
			}
			if n := len(e.sim.ListByOrder(e.orders.Load(), "demo")); n != 1 {
				t.Fatalf("captures at the simulator: %d, want 1", n)
			}
		})
	}
}

// TestForcedResolveWithoutAnAnswerIsAudited: with force, an operator may
// settle a charge whose lookup failed, but only once no lease is live, and
// the audit entry says it was forced and what the lookup answered.
func TestForcedResolveWithoutAnAnswerIsAudited(t *testing.T) {
	t.Parallel()
	e := setup(t, "sqlite")
	id, _ := e.stuck(t, "unreachable")
	e.acq.down.Store(true)
	path := "/admin/v1/charges/" + id + "/resolve"
	q := admin.ResolveRequest{Status: chargeonce.StatusDeclined, Reason: "the acquirer's support says it never arrived"}
	if st, b := e.call(t, "POST", path, bobKey, q); st != 409 || problemType(b) != chargeonce.EUNSURE || !strings.Contains(string(b), "connection refused") {
		t.Fatalf("resolving with the acquirer unreachable: %d %s, want 409 %s quoting the lookup", st, b, chargeonce.EUNSURE)
	}
	q.Force = true
	st, b := e.call(t, "POST", path, bobKey, q)
	var res struct{ Audit admin.EntryJSON }
	if st != 200 || json.Unmarshal(b, &res) != nil || !res.Audit.Forced || !strings.Contains(res.Audit.Detail, "lookup failed") {
		t.Fatalf("forced resolution: %d %s, want 200 with a forced audit entry quoting the failed lookup", st, b)
	}
}

func (a *downAcquirer) captures(ref string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.sent[ref]
}

// TestCommonPathWritesNoHistoryRows counts the rows of a PostgreSQL
// database through 50 charges on the common path: two per charge (the
// record and the charge), as before history existed, and none in
// charge_history.
func TestCommonPathWritesNoHistoryRows(t *testing.T) {
	t.Parallel()
	e := setup(t, "postgres")
	pool := e.store.(*postgres.Store).Pool()
	for i := range 50 {
		r := apitest.Charge(t, e.api.URL, fmt.Sprintf("common-%d", i), fmt.Sprintf(`{"order_id":%d,"amount_cents":100,"payment_token":"tok_ok"}`, e.orders.Add(1)))
		if r.Status != 201 {
			t.Fatalf("charge %d: %d %s", i, r.Status, r.Body)
		}
	}
	var keys, charges, history int
	if err := pool.QueryRow(t.Context(), `SELECT (SELECT count(*) FROM idempotency_keys), (SELECT count(*) FROM charges), (SELECT count(*) FROM charge_history)`).Scan(&keys, &charges, &history); err != nil {
		t.Fatal(err)
	}
	t.Logf("50 charges on the common path: %d records, %d charges, %d history rows", keys, charges, history)
	if keys != 50 || charges != 50 || history != 0 {
		t.Fatalf("rows after 50 common-path charges: %d records, %d charges, %d history; want 50, 50, 0", keys, charges, history)
	}
	// The history table refuses changes: audit entries are append-only.
	_, err := pool.Exec(t.Context(), `INSERT INTO charge_history (charge_id, merchant_id, kind, actor) VALUES ('ch_x', 'demo', 'lookup', 'test')`)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(t.Context(), `UPDATE charge_history SET reason = 'rewritten'`); err == nil || !strings.Contains(err.Error(), "append-only") {
		t.Fatalf("UPDATE of charge_history: %v, want refused", err)
	}
	if _, err := pool.Exec(t.Context(), `DELETE FROM charge_history`); err == nil || !strings.Contains(err.Error(), "append-only") {
		t.Fatalf("DELETE of charge_history: %v, want refused", err)
	}
}

// TestTimelineShowsEventDeliveries: a settled charge's timeline ends with
// its settlement event's delivery attempts, read from the webhook tables
// (nothing more is written for them), on both stores.
func TestTimelineShowsEventDeliveries(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"postgres", "sqlite"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			e := setup(t, kind)
			if _, err := e.store.WebhookEndpointCreate(t.Context(), chargeonce.WebhookEndpoint{
				ID: "we_timeline", MerchantID: "demo", URL: "https://example.com/hook", Secret: "whsec_dGVzdHRlc3R0ZXN0dGVzdA==",
			}); err != nil {
				t.Fatal(err)
			}
			body := fmt.Sprintf(`{"order_id":%d,"amount_cents":700,"payment_token":"tok_ok"}`, e.orders.Add(1))
			r := apitest.Charge(t, e.api.URL, "with-endpoint", body)
			if r.Status != 201 {
				t.Fatalf("charge: %d %s", r.Status, r.Body)
			}
			var ch struct{ ID string }
			_ = json.Unmarshal(r.Body, &ch)
			ds, err := e.store.WebhookDeliveriesClaim(t.Context(), time.Minute, 10, 10, nil)
			if err != nil || len(ds) != 1 {
				t.Fatalf("deliveries claimed: %+v, %v; want the charge's event", ds, err)
			}
			for _, o := range []chargeonce.WebhookOutcome{
				{Attempt: chargeonce.WebhookAttempt{StatusCode: 500}, RetryIn: time.Millisecond},
			} {
				o.Attempt.EventID, o.Attempt.EndpointID, o.Attempt.At = ds[0].Event.ID, ds[0].Endpoint.ID, time.Now()
				if _, err := e.store.WebhookDeliveryFinish(t.Context(), ds[0], o); err != nil {
					t.Fatal(err)
				}
			}
			_, b := e.call(t, "GET", "/admin/v1/charges/"+ch.ID, aliceKey, nil)
			var d admin.ChargeDetailJSON
			if err := json.Unmarshal(b, &d); err != nil {
				t.Fatal(err)
			}
			if got := historyKinds(d.History); got != "inserted capture settled webhook" {
				t.Fatalf("timeline %q, want the delivery attempt after the settlement: %s", got, b)
			}
			if w := d.History[3]; w.Outcome != "500" || !strings.Contains(w.Detail, "we_timeline") {
				t.Fatalf("delivery entry = %+v", w)
			}

			// A refund's events are newer than the settlement's, and their
			// attempts are not the settlement's (issue 48, item 6: the
			// timeline showed the newest event's).
			rr, err := apitest.Do(t, nil, "POST", e.api.URL+"/v1/charges/"+ch.ID+"/refunds", []byte(`{"amount_cents":100}`), map[string]string{"Idempotency-Key": "timeline-refund"})
			if err != nil || (rr.Status != 201 && rr.Status != 200) {
				t.Fatalf("refund: %d %s %v", rr.Status, rr.Body, err)
			}
			ds, err = e.store.WebhookDeliveriesClaim(t.Context(), time.Minute, 10, 10, nil)
			if err != nil || len(ds) == 0 {
				t.Fatalf("the refund's deliveries claimed: %+v, %v", ds, err)
			}
			for _, dl := range ds {
				if dl.Event.ID == "evt_"+ch.ID[3:] {
					continue // the settlement's retry, due already
				}
				o := chargeonce.WebhookOutcome{Attempt: chargeonce.WebhookAttempt{StatusCode: 418, EventID: dl.Event.ID, EndpointID: dl.Endpoint.ID}, RetryIn: time.Hour}
				if _, err := e.store.WebhookDeliveryFinish(t.Context(), dl, o); err != nil {
					t.Fatal(err)
				}
			}
			_, b = e.call(t, "GET", "/admin/v1/charges/"+ch.ID, aliceKey, nil)
			d = admin.ChargeDetailJSON{}
			if err := json.Unmarshal(b, &d); err != nil {
				t.Fatal(err)
			}
			var webhooks []string
			for _, h := range d.History {
				if h.Kind == chargeonce.HistoryWebhook {
					webhooks = append(webhooks, h.Outcome+" "+strings.Fields(h.Detail)[0])
				}
			}
			if want := "500 evt_" + ch.ID[3:]; len(webhooks) != 1 || webhooks[0] != want {
				t.Fatalf("after a refund, the timeline's deliveries are %q; want the settlement's one attempt, %q", webhooks, want)
			}
		})
	}
}
