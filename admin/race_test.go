package admin_test

import (
	"context"
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

// countingStore counts the completions that succeeded, per key.
type countingStore struct {
	chargeonce.Store
	mu   sync.Mutex
	done map[string]int
}

func (s *countingStore) KeyComplete(ctx context.Context, p chargeonce.KeyCompleteParams) error {
	err := s.Store.KeyComplete(ctx, p)
	if err == nil {
		s.mu.Lock()
		s.done[p.Key]++
		s.mu.Unlock()
	}
	return err
}

// TestResolveRacesRecovery: 20 stuck charges, recovery (eight drivers, pass
// after pass) and an operator resolving the same 20 at once through the
// admin API. Each charge is settled exactly once (by recovery's completion
// or by a resolution, never both), there is one audit entry per resolution
// that succeeded, every other resolution is refused with 409
// charge-not-processing, no reference is captured twice, and every
// merchant's retry replays the one stored answer.
func TestResolveRacesRecovery(t *testing.T) {
	t.Parallel()
	const n = 20
	opts := testOptions
	opts.BackoffBase, opts.BackoffMax = time.Millisecond, time.Millisecond // due for recovery at once
	e := setupWith(t, "postgres", opts)
	type stuckCharge struct{ id, key, body string }
	var charges []stuckCharge
	for i := range n {
		key := fmt.Sprintf("race-%d", i)
		id, body := e.stuck(t, key)
		charges = append(charges, stuckCharge{id, key, body})
	}

	counting := &countingStore{Store: e.store, done: map[string]int{}}
	rescuer := recovery.NewRescuer(counting, engine.New(counting, e.acq, opts), recovery.RescuerOptions{Parallelism: 8})
	var (
		wg                sync.WaitGroup
		start             = make(chan struct{})
		resolved, refused atomic.Int64
		unknown           atomic.Int64 // 503: the database did not answer in time
		mu                sync.Mutex
		resolvedKeys      = map[string]int{}
		recoveryPasses    atomic.Int64
		stopRecovery      = make(chan struct{})
	)
	wg.Go(func() {
		<-start
		for {
			select {
			case <-stopRecovery:
				return
			default:
			}
			if _, err := rescuer.RunOnce(t.Context()); err != nil {
				t.Errorf("recovery pass: %v", err)
				return
			}
			recoveryPasses.Add(1)
		}
	})
	var operators sync.WaitGroup
	for _, c := range charges {
		operators.Go(func() {
			<-start
			st, b := e.call(t, "POST", "/admin/v1/charges/"+c.id+"/resolve", aliceKey,
				admin.ResolveRequest{Status: chargeonce.StatusCaptured, Reason: "the acquirer's support confirmed the capture", Force: true})
			switch {
			case st == 200:
				resolved.Add(1)
				mu.Lock()
				resolvedKeys[c.key]++
				mu.Unlock()
			case st == 409 && (problemType(b) == chargeonce.ENOTPROCESSING || problemType(b) == chargeonce.ELEASED):
				refused.Add(1) // settled first, or recovery holds it now
			case st == 503 && problemType(b) == chargeonce.EUNAVAILABLE:
				// On a loaded machine the resolution's statement may outlive
				// the request's deadline: its outcome is unknown to the
				// operator (it may have committed). The audit trail below
				// says what happened.
				unknown.Add(1)
				t.Logf("resolve %s: %d %s", c.id, st, b)
			default:
				t.Errorf("resolve %s: %d %s", c.id, st, b)
			}
		})
	}
	close(start)
	operators.Wait()
	apitest.Eventually(t, 30*time.Second, "recovery to find nothing left", func() bool {
		page, err := e.store.(chargeonce.OperatorStore).ChargesListStuck(t.Context(), chargeonce.StuckListParams{Limit: 50, IncludeLeased: true})
		return err == nil && len(page.Charges) == 0
	})
	close(stopRecovery)
	wg.Wait()
	e.sim.Wait()

	// The audit trail is the operator's side of the story: one entry per
	// resolution that settled a charge, answered 200 or not.
	st, b := e.call(t, "GET", "/admin/v1/audit?limit=100", aliceKey, nil)
	var audit struct{ Data []admin.EntryJSON }
	if st != 200 || json.Unmarshal(b, &audit) != nil {
		t.Fatalf("audit trail: %d %s", st, b)
	}
	audited := map[string]int{}
	for _, en := range audit.Data {
		audited[en.ChargeID]++
	}
	if got := int64(len(audit.Data)); got < resolved.Load() || got > resolved.Load()+unknown.Load() {
		t.Errorf("audit trail holds %d entries for %d resolutions answered 200 and %d unknown", got, resolved.Load(), unknown.Load())
	}

	counting.mu.Lock()
	defer counting.mu.Unlock()
	recovered := 0
	for _, c := range charges {
		byRecovery, byOperator := counting.done[c.key], audited[c.id]
		recovered += byRecovery
		if resolvedKeys[c.key] == 1 && byOperator != 1 {
			t.Errorf("%s: resolution answered 200, %d audit entries", c.id, byOperator)
		}
		if byRecovery+byOperator != 1 {
			t.Errorf("%s settled %d times by recovery and %d by the operator, want once in all", c.id, byRecovery, byOperator)
		}
		if got := e.sim.CapturedCount("demo", orderOf(t, c.body)); got > 1 {
			t.Errorf("%s captured %d times at the acquirer", c.id, got)
		}
		r := apitest.Charge(t, e.api.URL, c.key, c.body)
		if r.Status != 201 || r.Header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("retry of %s: %d %s, want the stored 201 replayed", c.key, r.Status, r.Body)
		}
	}
	t.Logf("%d stuck charges: %d resolved by the operator (%d audit entries), %d refused (already settled, or recovery held it), %d unknown (503), %d settled by recovery in %d passes; captures per reference at most 1",
		n, resolved.Load(), len(audit.Data), refused.Load(), unknown.Load(), recovered, recoveryPasses.Load())
	if len(audit.Data)+recovered != n || resolved.Load()+refused.Load()+unknown.Load() != n {
		t.Fatalf("%d audited + %d recovered != %d, or %d resolved + %d refused + %d unknown != %d", len(audit.Data), recovered, n, resolved.Load(), refused.Load(), unknown.Load(), n)
	}
}

func orderOf(t *testing.T, body string) int64 {
	t.Helper()
	var r struct {
		OrderID int64 `json:"order_id"`
	}
	if err := json.Unmarshal([]byte(body), &r); err != nil {
		t.Fatal(err)
	}
	return r.OrderID
}

// TestResolveOperationRacesRecovery: 12 manual captures the acquirer made
// whose answers were lost, recovery (eight drivers, pass after pass) and
// an operator resolving the same 12 at once through the admin API. Each
// capture is settled exactly once (by recovery's completion or by a
// resolution, never both), with one audit entry per resolution that
// settled and one charge.captured event per charge; the acquirer saw one
// capture request per capture (recovery looks the reference up and finds
// it; a resolution only looks up), each authorization was captured once
// for its amount, and every merchant's retry replays the stored answer.
func TestResolveOperationRacesRecovery(t *testing.T) {
	t.Parallel()
	const n = 12
	opts := testOptions
	opts.BackoffBase, opts.BackoffMax = time.Millisecond, time.Millisecond // due for recovery at once
	e := setupWith(t, "postgres", opts)
	type stuckCapture struct{ chargeID, opID, key string }
	var caps []stuckCapture
	for i := range n {
		key := fmt.Sprintf("cp-race-%d", i)
		chargeID, opID := e.stuckOperation(t, chargeonce.KindCapture, key, 1000, `{"amount_cents":700}`)
		caps = append(caps, stuckCapture{chargeID, opID, key})
	}

	counting := &countingStore{Store: e.store, done: map[string]int{}}
	rescuer := recovery.NewRescuer(counting, engine.New(counting, e.acq, opts), recovery.RescuerOptions{Parallelism: 8})
	var (
		wg                         sync.WaitGroup
		start                      = make(chan struct{})
		resolved, refused, unknown atomic.Int64
		stopRecovery               = make(chan struct{})
	)
	wg.Go(func() {
		<-start
		for {
			select {
			case <-stopRecovery:
				return
			default:
			}
			if _, err := rescuer.RunOnce(t.Context()); err != nil {
				t.Errorf("recovery pass: %v", err)
				return
			}
		}
	})
	var operators sync.WaitGroup
	for _, c := range caps {
		operators.Go(func() {
			<-start
			st, b := e.call(t, "POST", "/admin/v1/operations/"+c.opID+"/resolve", aliceKey,
				admin.OperationResolveRequest{Status: chargeonce.OperationSucceeded, Reason: "the acquirer's support confirmed the capture"})
			switch {
			case st == 200:
				resolved.Add(1)
			case st == 409 && (problemType(b) == chargeonce.ENOTPROCESSING || problemType(b) == chargeonce.ELEASED):
				refused.Add(1)
			case st == 503 && problemType(b) == chargeonce.EUNAVAILABLE:
				unknown.Add(1) // a loaded machine: the audit trail says what happened
				t.Logf("resolve %s: %d %s", c.opID, st, b)
			default:
				t.Errorf("resolve %s: %d %s", c.opID, st, b)
			}
		})
	}
	close(start)
	operators.Wait()
	apitest.Eventually(t, 30*time.Second, "recovery to find nothing left", func() bool {
		page, err := e.store.(chargeonce.OperatorStore).ChargesListStuck(t.Context(), chargeonce.StuckListParams{Limit: 50, IncludeLeased: true})
		return err == nil && len(page.Charges) == 0
	})
	close(stopRecovery)
	wg.Wait()
	e.sim.Wait()

	st, b := e.call(t, "GET", "/admin/v1/audit?limit=100", aliceKey, nil)
	var audit struct{ Data []admin.EntryJSON }
	if st != 200 || json.Unmarshal(b, &audit) != nil {
		t.Fatalf("audit trail: %d %s", st, b)
	}
	audited := map[string]int{}
	for _, en := range audit.Data {
		if en.Kind == chargeonce.HistoryResolution {
			audited[en.ChargeID]++
		}
	}
	counting.mu.Lock()
	defer counting.mu.Unlock()
	recovered := 0
	for _, c := range caps {
		byRecovery, byOperator := counting.done[c.key], audited[c.opID]
		recovered += byRecovery
		if byRecovery+byOperator != 1 {
			t.Errorf("%s settled %d times by recovery and %d by the operator, want once in all", c.opID, byRecovery, byOperator)
		}
		if got := e.acq.captures(c.opID); got != 1 {
			t.Errorf("%s: %d capture requests reached the acquirer, want 1 (the attempt whose answer was lost)", c.opID, got)
		}
		if captured, voided := e.sim.Authorization(c.chargeID); captured != 700 || voided {
			t.Errorf("%s: the acquirer captured %d (voided %v), want 700 once", c.chargeID, captured, voided)
		}
		if got := e.eventTypes(t, c.chargeID); got[chargeonce.EventChargeCaptured] != 1 || len(got) != 1 {
			t.Errorf("%s: events %v, want charge.captured once", c.chargeID, got)
		}
		r := e.operate(t, chargeonce.KindCapture, c.chargeID, c.key, `{"amount_cents":700}`)
		if r.Status != 200 || r.Header.Get("Idempotent-Replayed") != "true" || !strings.Contains(string(r.Body), `"status":"captured"`) {
			t.Errorf("retry of %s: %d %s, want the stored 200 replayed", c.key, r.Status, r.Body)
		}
	}
	t.Logf("%d stuck captures: %d resolved by the operator (%d audit entries), %d refused, %d unknown (503), %d settled by recovery; capture requests per reference 1",
		n, resolved.Load(), len(audited), refused.Load(), unknown.Load(), recovered)
	if int64(len(audited)) < resolved.Load() || resolved.Load()+refused.Load()+unknown.Load() != n {
		t.Fatalf("%d audited for %d resolved; %d resolved + %d refused + %d unknown != %d", len(audited), resolved.Load(), resolved.Load(), refused.Load(), unknown.Load(), n)
	}
}
