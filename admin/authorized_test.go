package admin_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/admin"
	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/internal/apitest"
	"github.com/chargeonce/chargeonce/recovery"
)

// stuckAuthorization asks for a manual-capture charge whose authorization
// the acquirer makes and whose answer is lost on the way back: the answer
// is 202, the charge stays processing (backed off), and the acquirer holds
// the authorization. (Not tok_fail_after: the simulator loses the first
// capture's answer of such an authorization too.)
func (e *env) stuckAuthorization(t *testing.T, key string) (chargeID, body string) {
	t.Helper()
	e.acq.loseAuthorizations.Store(true)
	defer e.acq.loseAuthorizations.Store(false)
	body = fmt.Sprintf(`{"order_id":%d,"amount_cents":4100,"payment_token":"tok_ok","capture_method":"manual"}`, e.orders.Add(1))
	r := apitest.Charge(t, e.api.URL, key, body)
	var ch struct{ ID string }
	if err := json.Unmarshal(r.Body, &ch); err != nil || r.Status != 202 || ch.ID == "" {
		t.Fatalf("manual charge with its answer lost: %d %s, want 202", r.Status, r.Body)
	}
	return ch.ID, body
}

// auditOf returns the audit trail's entries for id.
func (e *env) auditOf(t *testing.T, id string) []admin.EntryJSON {
	t.Helper()
	st, b := e.call(t, "GET", "/admin/v1/audit?limit=100", aliceKey, nil)
	var audit struct{ Data []admin.EntryJSON }
	if st != 200 || json.Unmarshal(b, &audit) != nil {
		t.Fatalf("audit trail: %d %s", st, b)
	}
	var out []admin.EntryJSON
	for _, en := range audit.Data {
		if en.ChargeID == id {
			out = append(out, en)
		}
	}
	return out
}

// TestResolveAuthorized (issue 35): a manual-capture charge stuck
// processing after its authorization's answer was lost is resolved
// "authorized", as the acquirer says: settled exactly as the engine
// settles an authorization (the merchant's retry replays the bytes
// engine.FinalResponse gives the authorized charge, and no event, since an
// authorization records none), with one audit entry; the authorization is
// then captured through the merchant API, which records charge.captured
// once. "captured" on it is refused with a 400 naming status, with nothing
// changed: the acquirer was only asked to authorize.
func TestResolveAuthorized(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"postgres", "sqlite"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			e := setup(t, kind)
			id, body := e.stuckAuthorization(t, "auth-lost")
			path := "/admin/v1/charges/" + id + "/resolve"

			for _, bad := range []admin.ResolveRequest{
				{Status: chargeonce.StatusCaptured, Reason: "the acquirer's support says it was captured"},
				{Status: chargeonce.StatusCaptured, Reason: "forced", Force: true},
				{Status: chargeonce.StatusAuthorized, DeclineCode: "nope", Reason: "x"},
			} {
				st, b := e.call(t, "POST", path, bobKey, bad)
				var p chargeonce.Problem
				if st != 400 || json.Unmarshal(b, &p) != nil || problemType(b) != chargeonce.EINVALID || p.Field == "" {
					t.Fatalf("resolving the manual charge %+v: %d %s, want 400 with a field error", bad, st, b)
				}
			}
			_, b := e.call(t, "GET", "/admin/v1/charges/"+id, bobKey, nil)
			var d admin.ChargeDetailJSON
			if err := json.Unmarshal(b, &d); err != nil || d.Charge.Status != chargeonce.StatusProcessing || strings.Contains(historyKinds(d.History), "resolve") {
				t.Fatalf("after the refused resolutions: %s", b)
			}
			if a := e.auditOf(t, id); len(a) != 0 {
				t.Fatalf("refused requests left audit entries: %+v", a)
			}

			st, b := e.call(t, "POST", path, bobKey, admin.ResolveRequest{Status: chargeonce.StatusAuthorized, Reason: "the acquirer holds the authorization, ticket 77"})
			var res struct {
				Charge admin.ChargeJSON
				Audit  admin.EntryJSON
			}
			if st != 200 || json.Unmarshal(b, &res) != nil {
				t.Fatalf("resolving authorized: %d %s, want 200", st, b)
			}
			if res.Charge.Status != chargeonce.StatusAuthorized || res.Charge.DeclineCode != "" || res.Audit.Forced ||
				res.Audit.Actor != "admin:bob" || !strings.Contains(res.Audit.Detail, "found: authorized") || res.Audit.Outcome != "authorized" {
				t.Fatalf("resolution answered %s", b)
			}

			in, err := e.store.(chargeonce.OperatorStore).ChargeInspect(t.Context(), id)
			if err != nil || in.Charge.Status != chargeonce.StatusAuthorized || in.Charge.CaptureMethod != chargeonce.CaptureManual {
				t.Fatalf("the charge after the resolution: %+v, %v", in.Charge, err)
			}
			want := engine.FinalResponse(&in.Charge)
			for range 2 {
				r := apitest.Charge(t, e.api.URL, "auth-lost", body)
				if r.Status != want.Status || r.Header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(r.Body, want.Body) {
					t.Fatalf("the merchant's retry: %d %s (replayed %q), want %d %s", r.Status, r.Body, r.Header.Get("Idempotent-Replayed"), want.Status, want.Body)
				}
			}
			if got := e.eventTypes(t, id); len(got) != 0 {
				t.Fatalf("events after the authorization was resolved: %v, want none (an authorization records no event)", got)
			}
			if a := e.auditOf(t, id); len(a) != 1 || a[0].Kind != chargeonce.HistoryResolution || a[0].ID != res.Audit.ID {
				t.Fatalf("audit entries of %s: %+v, want the one resolution", id, a)
			}
			if st, b := e.call(t, "POST", path, aliceKey, admin.ResolveRequest{Status: chargeonce.StatusAuthorized, Reason: "again"}); st != 409 || problemType(b) != chargeonce.ENOTPROCESSING {
				t.Fatalf("resolving it again: %d %s, want 409 %s", st, b, chargeonce.ENOTPROCESSING)
			}

			// Money flows on: the authorization is captured as any other.
			r := e.operate(t, chargeonce.KindCapture, id, "auth-lost-capture", `{"amount_cents":4000}`)
			if r.Status != 200 || !strings.Contains(string(r.Body), `"status":"captured"`) || !strings.Contains(string(r.Body), `"amount_captured_cents":4000`) {
				t.Fatalf("capturing the resolved authorization: %d %s", r.Status, r.Body)
			}
			if got := e.eventTypes(t, id); got[chargeonce.EventChargeCaptured] != 1 || len(got) != 1 {
				t.Fatalf("events after the capture: %v, want charge.captured once", got)
			}
			if captured, voided := e.sim.Authorization(id); captured != 4000 || voided {
				t.Fatalf("the acquirer captured %d (voided %v), want 4000", captured, voided)
			}
			if n := e.acq.captures(id); n != 1 {
				t.Fatalf("authorizations sent for %s: %d, want 1 (a resolution only looks up)", id, n)
			}
		})
	}
}

// TestResolveRefusesTheOtherCaptureMethod: "authorized" is refused on an
// automatic-capture charge with a 400 naming status, and nothing changes:
// no claim, no lookup, no entry in its history or the audit trail.
func TestResolveRefusesTheOtherCaptureMethod(t *testing.T) {
	t.Parallel()
	e := setup(t, "sqlite")
	id, _ := e.stuck(t, "automatic-stuck")
	for _, force := range []bool{false, true} {
		st, b := e.call(t, "POST", "/admin/v1/charges/"+id+"/resolve", bobKey,
			admin.ResolveRequest{Status: chargeonce.StatusAuthorized, Reason: "the acquirer says authorized", Force: force})
		var p chargeonce.Problem
		if st != 400 || json.Unmarshal(b, &p) != nil || p.Type != chargeonce.ProblemTypeBase+chargeonce.EINVALID || p.Field != "status" ||
			!strings.Contains(p.Detail, "manual") {
			t.Fatalf("authorized on an automatic charge (force %v): %d %s, want 400 on status", force, st, b)
		}
	}
	_, b := e.call(t, "GET", "/admin/v1/charges/"+id, bobKey, nil)
	var d admin.ChargeDetailJSON
	if err := json.Unmarshal(b, &d); err != nil || d.Charge.Status != chargeonce.StatusProcessing || historyKinds(d.History) != "inserted capture" {
		t.Fatalf("after the refusals: %s", b)
	}
	if a := e.auditOf(t, id); len(a) != 0 {
		t.Fatalf("refused requests left audit entries: %+v", a)
	}
	// The charge's own outcomes still work.
	if st, b := e.call(t, "POST", "/admin/v1/charges/"+id+"/resolve", bobKey,
		admin.ResolveRequest{Status: chargeonce.StatusDeclined, Reason: "the acquirer never saw it"}); st != 200 {
		t.Fatalf("declining it: %d %s", st, b)
	}
}

// TestResolveAuthorizedRacesRecovery: round after round, one stuck
// authorization, and eight goroutines at once: four resolve it
// "authorized" through the admin API, four run recovery passes (which look
// the reference up, find the authorization and settle it), held back a
// little longer each round so that either side may win. It is settled
// exactly once (by recovery's completion or by one resolution), with no
// event, one authorization at the acquirer, and the merchant's retry
// replays the one stored answer.
func TestResolveAuthorizedRacesRecovery(t *testing.T) {
	t.Parallel()
	const rounds, racers = 6, 8
	opts := testOptions
	opts.BackoffBase, opts.BackoffMax = time.Millisecond, time.Millisecond // due for recovery at once
	e := setupWith(t, "postgres", opts)
	counting := &countingStore{Store: e.store, done: map[string]int{}}
	eng := engine.New(counting, e.acq, opts)
	var byOperator, byRecovery int
	for round := range rounds {
		key := fmt.Sprintf("auth-race-%d", round)
		id, body := e.stuckAuthorization(t, key)
		var (
			wg       sync.WaitGroup
			start    = make(chan struct{})
			resolved atomic.Int64
		)
		for i := range racers {
			if i%2 == 0 {
				wg.Go(func() {
					<-start
					st, b := e.call(t, "POST", "/admin/v1/charges/"+id+"/resolve", aliceKey,
						admin.ResolveRequest{Status: chargeonce.StatusAuthorized, Reason: "the acquirer holds the authorization"})
					switch {
					case st == 200:
						resolved.Add(1)
					case st == 409 && (problemType(b) == chargeonce.ENOTPROCESSING || problemType(b) == chargeonce.ELEASED):
					case st == 503 && problemType(b) == chargeonce.EUNAVAILABLE:
						t.Logf("resolve %s: %d %s (the audit trail says what happened)", id, st, b)
					default:
						t.Errorf("resolve %s: %d %s", id, st, b)
					}
				})
				continue
			}
			wg.Go(func() {
				rescuer := recovery.NewRescuer(counting, eng, recovery.RescuerOptions{Parallelism: 2})
				<-start
				// Recovery, in process, is quicker off the mark than a
				// resolution over HTTP: later rounds hold it back a little
				// more, so that both sides win some rounds.
				time.Sleep(time.Duration(round) * 4 * time.Millisecond)
				for range 3 {
					if _, err := rescuer.RunOnce(t.Context()); err != nil {
						t.Errorf("recovery pass: %v", err)
						return
					}
				}
			})
		}
		close(start)
		wg.Wait()
		apitest.Eventually(t, 30*time.Second, "the authorization to be settled", func() bool {
			rec, err := e.store.KeyGet(t.Context(), "demo", key)
			return err == nil && rec.State == chargeonce.KeyCompleted
		})

		resolutions := 0
		for _, en := range e.auditOf(t, id) {
			if en.Kind == chargeonce.HistoryResolution {
				resolutions++
			}
		}
		counting.mu.Lock()
		recovered := counting.done[key]
		counting.mu.Unlock()
		if recovered+resolutions != 1 || int64(resolutions) < resolved.Load() {
			t.Fatalf("round %d: %s settled %d times by recovery and %d by resolutions (%d answered 200), want once in all", round, id, recovered, resolutions, resolved.Load())
		}
		byOperator += resolutions
		byRecovery += recovered
		in, err := e.store.(chargeonce.OperatorStore).ChargeInspect(t.Context(), id)
		if err != nil || in.Charge.Status != chargeonce.StatusAuthorized {
			t.Fatalf("round %d: the charge: %+v, %v; want authorized", round, in.Charge, err)
		}
		if got := e.eventTypes(t, id); len(got) != 0 {
			t.Fatalf("round %d: events %v, want none", round, got)
		}
		if n := e.acq.captures(id); n != 1 {
			t.Fatalf("round %d: authorizations sent for %s: %d, want 1", round, id, n)
		}
		want := engine.FinalResponse(&in.Charge)
		if r := apitest.Charge(t, e.api.URL, key, body); r.Status != 201 || r.Header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(r.Body, want.Body) {
			t.Fatalf("round %d: the retry: %d %s, want %s replayed", round, r.Status, r.Body, want.Body)
		}
	}
	t.Logf("%d rounds of %d racers: settled %d times by a resolution, %d by recovery; once per round", rounds, racers, byOperator, byRecovery)
}
