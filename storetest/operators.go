package storetest

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
)

// RunOperators runs the conformance suite of chargeonce.OperatorStore (SPEC
// "Operators"): the stuck list, history, and resolution. newStore is as for
// Run; the store it returns must implement chargeonce.OperatorStore.
func RunOperators(t *testing.T, newStore func(t *testing.T) chargeonce.Store) {
	tests := []struct {
		name string
		fn   func(t *testing.T, s chargeonce.Store, o chargeonce.OperatorStore)
	}{
		{"StuckListAcrossMerchants", testStuckListAcrossMerchants},
		{"StuckListPages", testStuckListPages},
		{"StuckListBadParams", testStuckListBadParams},
		{"StuckListLeavesOutLiveLeases", testStuckListLeavesOutLiveLeases},
		{"StuckRefundsListedAndResolved", testStuckRefundsListedAndResolved},
		{"StuckOperationsListedAndResolved", testStuckOperationsListedAndResolved},
		{"StuckOperationFailedFreesCharge", testStuckOperationFailedFreesCharge},
		{"ResolveOperationRacesRecovery", testResolveOperationRacesRecovery},
		{"CommonPathWritesNoHistory", testCommonPathWritesNoHistory},
		{"InspectKeepsCaptureMethod", testInspectKeepsCaptureMethod},
		{"HistoryAppendsInOrder", testHistoryAppendsInOrder},
		{"ResolveTakesOverAndAudits", testResolveTakesOverAndAudits},
		{"ResolveNotProcessing", testResolveNotProcessing},
		{"ResolveClaimMeasuresQuiet", testResolveClaimMeasuresQuiet},
		{"ResolveWritesOutbox", testResolveWritesOutbox},
		{"ResolveRacesCompletion", testResolveRacesCompletion},
		{"ResolveWritesOneWebhookEvent", testResolveWritesOneWebhookEvent},
		{"ResolveNeverTakesALiveLease", testResolveNeverTakesALiveLease},
		{"AcquirerIDAndAge", testAcquirerIDAndAge},
		{"ResolveWritesEventWithNoEnabledEndpoint", testResolveWritesEventWithNoEnabledEndpoint},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := newStore(t)
			o, ok := s.(chargeonce.OperatorStore)
			if !ok {
				t.Fatalf("%T does not implement chargeonce.OperatorStore", s)
			}
			tt.fn(t, s, o)
		})
	}
}

// stuckIDs lists every processing charge's id through pages of limit.
func stuckIDs(t *testing.T, o chargeonce.OperatorStore, p chargeonce.StuckListParams) []string {
	t.Helper()
	var ids []string
	for range 1000 {
		page, err := o.ChargesListStuck(t.Context(), p)
		if err != nil {
			t.Fatalf("ChargesListStuck(%+v): %v", p, err)
		}
		for _, c := range page.Charges {
			if c.Operation != nil && c.Operation.Status != chargeonce.OperationPending {
				t.Fatalf("stuck list holds %s %s, which is %s", c.Operation.Kind, c.Operation.ID, c.Operation.Status)
			}
			if c.Refund == nil && c.Operation == nil && c.Charge.Status != chargeonce.StatusProcessing {
				t.Fatalf("stuck list holds %s, which is %s", c.Charge.ID, c.Charge.Status)
			}
			if c.Refund != nil && c.Refund.Status != chargeonce.RefundPending {
				t.Fatalf("stuck list holds refund %s, which is %s", c.Refund.ID, c.Refund.Status)
			}
			ids = append(ids, c.ObjectID())
		}
		if !page.HasMore {
			return ids
		}
		if len(page.Charges) == 0 {
			t.Fatal("a page with has_more holds no charge")
		}
		p.After = page.Charges[len(page.Charges)-1].ObjectID()
	}
	t.Fatal("the stuck list never ended")
	return nil
}

// oldestFirst sorts charge ids the way the stuck list orders them.
func oldestFirst(t *testing.T, o chargeonce.OperatorStore, ids []string) []string {
	t.Helper()
	type ch struct {
		id string
		at time.Time
	}
	var cs []ch
	for _, id := range ids {
		in, err := o.ChargeInspect(t.Context(), id)
		if err != nil {
			t.Fatalf("ChargeInspect(%s): %v", id, err)
		}
		cs = append(cs, ch{id, in.Charge.CreatedAt})
	}
	slices.SortFunc(cs, func(a, b ch) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return cmp.Compare(a.id, b.id)
	})
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = c.id
	}
	return out
}

func testStuckListAcrossMerchants(t *testing.T, s chargeonce.Store, o chargeonce.OperatorStore) {
	var acme, globex []string
	for i := range 3 {
		p := newIntent("acme", fmt.Sprintf("a-%d", i))
		insert(t, s, p)
		acme = append(acme, p.Charge.ID)
		q := newIntent("globex", fmt.Sprintf("g-%d", i))
		insert(t, s, q)
		globex = append(globex, q.Charge.ID)
	}
	// A settled charge is not stuck.
	done := newIntent("acme", "done")
	insert(t, s, done)
	complete(t, s, "acme", "done", done.Token, []byte(`{}`))
	// A charge recovery backed off: its lease lies ahead, and the list
	// says when it is tried next and what happened last.
	if err := s.KeyLeaseSet(t.Context(), "acme", "a-1", get(t, s, "acme", "a-1").Token, 10*time.Minute, true); err != nil {
		t.Fatalf("KeyLeaseSet: %v", err)
	}
	if err := o.HistoryAppend(t.Context(), chargeonce.HistoryEntry{
		ChargeID: acme[1], MerchantID: "acme", Kind: chargeonce.HistoryCapture, Actor: "recovery", Outcome: "error", Detail: "acquirer timed out",
	}); err != nil {
		t.Fatalf("HistoryAppend: %v", err)
	}

	all := stuckIDs(t, o, chargeonce.StuckListParams{Limit: 50, IncludeLeased: true})
	if want := oldestFirst(t, o, append(slices.Clone(acme), globex...)); !slices.Equal(all, want) {
		t.Fatalf("stuck list = %v, want oldest first %v", all, want)
	}
	if got, want := stuckIDs(t, o, chargeonce.StuckListParams{Limit: 50, MerchantID: "globex", IncludeLeased: true}), oldestFirst(t, o, globex); !slices.Equal(got, want) {
		t.Fatalf("stuck list of globex = %v, want %v", got, want)
	}
	if got := stuckIDs(t, o, chargeonce.StuckListParams{Limit: 50, OlderThan: time.Hour, IncludeLeased: true}); len(got) != 0 {
		t.Fatalf("stuck list older than 1h = %v, want none", got)
	}
	page, err := o.ChargesListStuck(t.Context(), chargeonce.StuckListParams{Limit: 50, MerchantID: "acme", IncludeLeased: true})
	if err != nil {
		t.Fatalf("ChargesListStuck: %v", err)
	}
	for _, c := range page.Charges {
		if c.Age < 0 || c.Age > time.Minute {
			t.Errorf("%s: age %v, want young", c.Charge.ID, c.Age)
		}
		if c.Charge.ID != acme[1] {
			if c.Last != nil || c.Attempts != 0 {
				t.Errorf("%s: last %+v attempts %d, want none", c.Charge.ID, c.Last, c.Attempts)
			}
			continue
		}
		if c.Attempts != 1 || time.Until(c.NextAttempt) < 5*time.Minute {
			t.Errorf("backed-off charge: attempts %d, next attempt in %v; want 1, about 10m", c.Attempts, time.Until(c.NextAttempt))
		}
		if c.Last == nil || c.Last.Kind != chargeonce.HistoryCapture || c.Last.Detail != "acquirer timed out" || c.Last.At.IsZero() {
			t.Errorf("backed-off charge: last entry %+v, want the capture error", c.Last)
		}
	}
}

func testStuckListPages(t *testing.T, s chargeonce.Store, o chargeonce.OperatorStore) {
	var ids []string
	for i := range 7 {
		p := newIntent(fmt.Sprintf("m%d", i%3), fmt.Sprintf("k-%d", i))
		insert(t, s, p)
		ids = append(ids, p.Charge.ID)
	}
	want := oldestFirst(t, o, ids)
	for _, limit := range []int{1, 2, 3, 7, 8} {
		if got := stuckIDs(t, o, chargeonce.StuckListParams{Limit: limit, IncludeLeased: true}); !slices.Equal(got, want) {
			t.Fatalf("pages of %d = %v, want %v", limit, got, want)
		}
	}
	// A cursor that was settled meanwhile still marks its place.
	first, err := o.ChargesListStuck(t.Context(), chargeonce.StuckListParams{Limit: 3, IncludeLeased: true})
	if err != nil || len(first.Charges) != 3 || !first.HasMore {
		t.Fatalf("first page = %+v, %v; want 3 with more", first, err)
	}
	last := first.Charges[2]
	complete(t, s, last.Charge.MerchantID, last.Charge.IdempotencyKey, get(t, s, last.Charge.MerchantID, last.Charge.IdempotencyKey).Token, []byte(`{}`))
	if got := stuckIDs(t, o, chargeonce.StuckListParams{Limit: 2, After: last.Charge.ID, IncludeLeased: true}); !slices.Equal(got, want[3:]) {
		t.Fatalf("after a settled cursor = %v, want %v", got, want[3:])
	}
}

// testStuckListLeavesOutLiveLeases: a charge an attempt drives under a
// live lease is not listed unless asked (its capture may still be
// answered), and is marked in flight when it is; one recovery backed off,
// and one whose driver died (its lease ended, still held), are listed.
func testStuckListLeavesOutLiveLeases(t *testing.T, s chargeonce.Store, o chargeonce.OperatorStore) {
	live := newIntent("acme", "live")
	insert(t, s, live)
	backedOff := newIntent("acme", "backed-off")
	insert(t, s, backedOff)
	if err := s.KeyLeaseSet(t.Context(), "acme", "backed-off", backedOff.Token, 10*time.Minute, true); err != nil {
		t.Fatalf("KeyLeaseSet: %v", err)
	}
	died := newIntent("acme", "died")
	died.Lease = time.Millisecond
	insert(t, s, died)
	time.Sleep(20 * time.Millisecond)

	want := oldestFirst(t, o, []string{backedOff.Charge.ID, died.Charge.ID})
	if got := stuckIDs(t, o, chargeonce.StuckListParams{Limit: 50}); !slices.Equal(got, want) {
		t.Fatalf("stuck list = %v, want %v (the live lease left out)", got, want)
	}
	page, err := o.ChargesListStuck(t.Context(), chargeonce.StuckListParams{Limit: 50, IncludeLeased: true})
	if err != nil {
		t.Fatalf("ChargesListStuck: %v", err)
	}
	inFlight := map[string]bool{}
	for _, c := range page.Charges {
		inFlight[c.Charge.ID] = c.InFlight
	}
	if len(inFlight) != 3 || !inFlight[live.Charge.ID] || inFlight[backedOff.Charge.ID] || inFlight[died.Charge.ID] {
		t.Fatalf("with IncludeLeased, in flight = %v; want all three, only %s in flight", inFlight, live.Charge.ID)
	}
	// Paging with IncludeLeased off skips the live one on every page.
	if got := stuckIDs(t, o, chargeonce.StuckListParams{Limit: 1}); !slices.Equal(got, want) {
		t.Fatalf("pages of 1 = %v, want %v", got, want)
	}
}

// testStuckRefundsListedAndResolved: a pending refund nobody drives is
// listed with its charge, after the charges and refunds older than it; an
// operator's claim takes it (and not one under a live lease), and the
// resolution settles it with the statement refunds settle with (a failed
// refund gives its amount back to the charge) and appends the audit entry
// under the refund's id, once.
func testStuckRefundsListedAndResolved(t *testing.T, s chargeonce.Store, o chargeonce.OperatorStore) {
	ch := capturedCharge(t, s, "acme", 1000)
	stuck := newRefund(ch, "rf-stuck", 400)
	stuck.Lease = time.Millisecond
	insertRefund(t, s, stuck)
	live := newRefund(ch, "rf-live", 400)
	insertRefund(t, s, live)
	lateCharge := newIntent("acme", "late")
	lateCharge.Lease = time.Millisecond
	insert(t, s, lateCharge)
	time.Sleep(20 * time.Millisecond)

	if got, want := stuckIDs(t, o, chargeonce.StuckListParams{Limit: 1}), []string{stuck.Refund.ID, lateCharge.Charge.ID}; !slices.Equal(got, want) {
		t.Fatalf("stuck list in pages of 1 = %v, want %v (the refund under a live lease left out)", got, want)
	}
	page, err := o.ChargesListStuck(t.Context(), chargeonce.StuckListParams{Limit: 50, IncludeLeased: true})
	if err != nil {
		t.Fatalf("ChargesListStuck: %v", err)
	}
	if len(page.Charges) != 3 {
		t.Fatalf("with IncludeLeased: %d rows, want 3", len(page.Charges))
	}
	r := page.Charges[0]
	if r.Kind() != chargeonce.KindRefund || r.Refund.ID != stuck.Refund.ID || r.Charge.ID != ch.ID || r.Charge.Status != chargeonce.StatusCaptured ||
		r.Refund.AmountCents != 400 || r.Refund.Currency != ch.Currency || r.InFlight || r.Age < 0 || r.Age > time.Minute {
		t.Fatalf("the stuck refund's row: %+v (refund %+v)", r, r.Refund)
	}
	if page.Charges[2].Kind() != chargeonce.KindCharge || page.Charges[1].Refund == nil || !page.Charges[1].InFlight {
		t.Fatalf("rows: %+v", page.Charges)
	}

	_, err = o.ChargeResolveClaim(t.Context(), live.Refund.ID, "tok_op", time.Minute)
	wantCode(t, "claiming a refund under a live lease", err, chargeonce.ELEASED)
	_, err = o.ChargeResolveClaim(t.Context(), "re_nope", "tok_op", time.Minute)
	wantCode(t, "claiming no refund", err, chargeonce.ENOTFOUND)
	rec, err := o.ChargeResolveClaim(t.Context(), stuck.Refund.ID, "tok_op", time.Minute)
	if err != nil || rec.Refund == nil || rec.Refund.ID != stuck.Refund.ID || rec.Token != "tok_op" {
		t.Fatalf("claiming the stuck refund: %+v, %v", rec, err)
	}
	audit, err := o.ChargeResolve(t.Context(), chargeonce.ResolveParams{
		Complete: chargeonce.KeyCompleteParams{
			Kind: chargeonce.KindRefund, MerchantID: "acme", Key: rec.Key, Token: "tok_op",
			RefundStatus: chargeonce.RefundFailed, FailureReason: "operator_failed",
			ResponseStatus: 201, ResponseBody: []byte(`{"status":"failed"}`), TTL: time.Hour,
		},
		Audit: chargeonce.HistoryEntry{ChargeID: stuck.Refund.ID, MerchantID: "acme", Kind: chargeonce.HistoryResolution,
			Actor: "admin:alice", Outcome: "failed (operator_failed)", Reason: "ticket 9"},
	})
	if err != nil || audit.ID == 0 {
		t.Fatalf("resolving the refund: %+v, %v", audit, err)
	}
	rf, err := s.RefundGet(t.Context(), "acme", stuck.Refund.ID)
	if err != nil || rf.Status != chargeonce.RefundFailed || rf.FailureReason != "operator_failed" {
		t.Fatalf("the resolved refund: %+v, %v", rf, err)
	}
	if got := get(t, s, "acme", "rf-stuck"); got.State != chargeonce.KeyCompleted || string(got.ResponseBody) != `{"status":"failed"}` {
		t.Fatalf("the refund's record after the resolution: %+v", got)
	}
	// The failed refund's 400 went back: 600 remain besides the live 400.
	insertRefund(t, s, newRefund(ch, "rf-rest", 600))
	h, err := o.ChargeHistory(t.Context(), stuck.Refund.ID)
	if err != nil || len(h) != 1 || h[0].Kind != chargeonce.HistoryResolution || h[0].Reason != "ticket 9" {
		t.Fatalf("the refund's history: %+v, %v", h, err)
	}
	_, err = o.ChargeResolveClaim(t.Context(), stuck.Refund.ID, "tok_op2", time.Minute)
	wantCode(t, "claiming a settled refund", err, chargeonce.ENOTPROCESSING)
}

func testStuckListBadParams(t *testing.T, _ chargeonce.Store, o chargeonce.OperatorStore) {
	for _, tc := range []struct {
		p     chargeonce.StuckListParams
		field string
	}{
		{chargeonce.StuckListParams{Limit: 0}, "limit"},
		{chargeonce.StuckListParams{Limit: chargeonce.StuckListMaxLimit + 1}, "limit"},
		{chargeonce.StuckListParams{Limit: 5, OlderThan: -time.Second}, "older_than"},
		{chargeonce.StuckListParams{Limit: 5, After: "ch_nope"}, "after"},
	} {
		_, err := o.ChargesListStuck(t.Context(), tc.p)
		wantCode(t, fmt.Sprintf("ChargesListStuck(%+v)", tc.p), err, chargeonce.EINVALID)
		if e, ok := errors.AsType[*chargeonce.Error](err); !ok || e.Field != tc.field {
			t.Errorf("ChargesListStuck(%+v): %v, want field %q", tc.p, err, tc.field)
		}
	}
}

func testCommonPathWritesNoHistory(t *testing.T, s chargeonce.Store, o chargeonce.OperatorStore) {
	p := newIntent("m1", "k")
	insert(t, s, p)
	in, err := o.ChargeInspect(t.Context(), p.Charge.ID)
	if err != nil || !in.HasRecord || in.State != chargeonce.KeyProcessing || in.Charge.Status != chargeonce.StatusProcessing {
		t.Fatalf("ChargeInspect of a new charge = %+v, %v", in, err)
	}
	complete(t, s, "m1", "k", p.Token, []byte(`{}`))
	in, err = o.ChargeInspect(t.Context(), p.Charge.ID)
	if err != nil {
		t.Fatalf("ChargeInspect: %v", err)
	}
	checkCharge(t, "ChargeInspect", in.Charge, p.Charge, chargeonce.StatusCaptured, "")
	if !in.HasRecord || in.State != chargeonce.KeyCompleted || in.UpdatedAt.Before(in.Charge.CreatedAt) {
		t.Fatalf("ChargeInspect of a settled charge = %+v", in)
	}
	h, err := o.ChargeHistory(t.Context(), p.Charge.ID)
	if err != nil || len(h) != 0 {
		t.Fatalf("history of a charge on the common path = %+v, %v; want no rows", h, err)
	}
	a, err := o.AuditList(t.Context(), chargeonce.AuditListParams{Limit: 10})
	if err != nil || len(a) != 0 {
		t.Fatalf("audit trail = %+v, %v; want empty", a, err)
	}
	_, err = o.ChargeInspect(t.Context(), "ch_nope")
	wantCode(t, "ChargeInspect(unknown)", err, chargeonce.ENOTFOUND)
}

// testInspectKeepsCaptureMethod: the operators' reads of a manual charge
// (ChargeInspect, ChargesListStuck) carry its capture method, as the
// merchant's reads do: an operator resolves a stuck authorization
// "authorized", never "captured", and the console offers that by it.
func testInspectKeepsCaptureMethod(t *testing.T, s chargeonce.Store, o chargeonce.OperatorStore) {
	p := newIntent("m-auth", "stuck-auth")
	p.Charge.CaptureMethod = chargeonce.CaptureManual
	insert(t, s, p)
	in, err := o.ChargeInspect(t.Context(), p.Charge.ID)
	if err != nil || in.Charge.CaptureMethod != chargeonce.CaptureManual || in.Charge.Status != chargeonce.StatusProcessing {
		t.Fatalf("ChargeInspect of a processing manual charge = %+v, %v; want capture method manual", in.Charge, err)
	}
	page, err := o.ChargesListStuck(t.Context(), chargeonce.StuckListParams{Limit: 10, IncludeLeased: true})
	if err != nil || len(page.Charges) != 1 || page.Charges[0].Charge.CaptureMethod != chargeonce.CaptureManual {
		t.Fatalf("ChargesListStuck with a manual charge = %+v, %v; want its capture method", page.Charges, err)
	}
	auth := authorizedCharge(t, s, "m-auth", 300)
	if in, err := o.ChargeInspect(t.Context(), auth.ID); err != nil || in.Charge.CaptureMethod != chargeonce.CaptureManual {
		t.Fatalf("ChargeInspect of an authorization = %+v, %v; want capture method manual", in.Charge, err)
	}
	auto := newIntent("m-auth", "stuck-auto")
	insert(t, s, auto)
	if in, err := o.ChargeInspect(t.Context(), auto.Charge.ID); err != nil || in.Charge.CaptureMethod != "" {
		t.Fatalf("ChargeInspect of an automatic charge = %+v, %v; want no capture method", in.Charge, err)
	}
}

func testHistoryAppendsInOrder(t *testing.T, s chargeonce.Store, o chargeonce.OperatorStore) {
	p, other := newIntent("m1", "k"), newIntent("m2", "k")
	insert(t, s, p)
	insert(t, s, other)
	entries := []chargeonce.HistoryEntry{
		{ChargeID: p.Charge.ID, MerchantID: "m1", Kind: chargeonce.HistoryRecoveryClaim, Actor: "recovery"},
		{ChargeID: p.Charge.ID, MerchantID: "m1", Kind: chargeonce.HistoryLookup, Actor: "recovery", Outcome: "unsure", Detail: "search lags ✓"},
		{ChargeID: other.Charge.ID, MerchantID: "m2", Kind: chargeonce.HistoryLookup, Actor: "recovery", Outcome: "safe-to-send"},
	}
	if err := o.HistoryAppend(t.Context(), entries...); err != nil {
		t.Fatalf("HistoryAppend: %v", err)
	}
	if err := o.HistoryAppend(t.Context(), chargeonce.HistoryEntry{
		ChargeID: p.Charge.ID, MerchantID: "m1", Kind: chargeonce.HistoryCapture, Actor: "recovery", Outcome: "error", Detail: "EOF",
	}); err != nil {
		t.Fatalf("HistoryAppend: %v", err)
	}
	h, err := o.ChargeHistory(t.Context(), p.Charge.ID)
	if err != nil {
		t.Fatalf("ChargeHistory: %v", err)
	}
	kinds := []chargeonce.HistoryKind{}
	for i, e := range h {
		kinds = append(kinds, e.Kind)
		if e.ChargeID != p.Charge.ID || e.At.IsZero() || e.ID == 0 || (i > 0 && e.ID <= h[i-1].ID) {
			t.Fatalf("entry %d = %+v", i, e)
		}
	}
	if want := []chargeonce.HistoryKind{chargeonce.HistoryRecoveryClaim, chargeonce.HistoryLookup, chargeonce.HistoryCapture}; !slices.Equal(kinds, want) {
		t.Fatalf("history kinds = %v, want %v", kinds, want)
	}
	if h[1].Detail != "search lags ✓" || h[1].Outcome != "unsure" || h[2].Detail != "EOF" {
		t.Fatalf("entries lost their text: %+v", h)
	}
	err = o.HistoryAppend(t.Context(), chargeonce.HistoryEntry{ChargeID: p.Charge.ID, MerchantID: "m1", Kind: "lookup", Actor: "x", Detail: "nul\x00"})
	wantCode(t, "HistoryAppend(NUL)", err, chargeonce.EINVALID)
}

// resolveParams settles rec's charge as an operator named admin decided.
func resolveParams(rec chargeonce.KeyRecord, token string, status chargeonce.Status, admin string) chargeonce.ResolveParams {
	code, respStatus := "", 201
	if status == chargeonce.StatusDeclined {
		code, respStatus = "operator_declined", 402
	}
	return chargeonce.ResolveParams{
		Complete: chargeonce.KeyCompleteParams{
			MerchantID: rec.MerchantID, Key: rec.Key, Token: token,
			ChargeStatus: status, DeclineCode: code, ResponseStatus: respStatus,
			ResponseBody: []byte(`{"id":"` + rec.Charge.ID + `","status":"` + string(status) + `"}`), TTL: longTTL,
		},
		Audit: chargeonce.HistoryEntry{
			ChargeID: rec.Charge.ID, MerchantID: rec.MerchantID, Kind: chargeonce.HistoryResolution,
			Actor: "admin:" + admin, Outcome: string(status), Detail: "unsure: capture under way", Reason: "the acquirer's support confirmed it",
		},
	}
}

func testResolveTakesOverAndAudits(t *testing.T, s chargeonce.Store, o chargeonce.OperatorStore) {
	p := newIntent("m1", "k")
	insert(t, s, p)
	// The attempt let go of it: an unknown outcome, backed off for ten
	// minutes. Nobody drives it, so an operator may take it over.
	if err := s.KeyLeaseSet(t.Context(), "m1", "k", p.Token, 10*time.Minute, true); err != nil {
		t.Fatalf("KeyLeaseSet: %v", err)
	}
	rec, err := o.ChargeResolveClaim(t.Context(), p.Charge.ID, "tok_operator", time.Minute)
	if err != nil {
		t.Fatalf("ChargeResolveClaim: %v", err)
	}
	if rec.Token != "tok_operator" || rec.Key != "k" || rec.MerchantID != "m1" || rec.Charge.ID != p.Charge.ID || rec.State != chargeonce.KeyProcessing || !rec.LeaseHeld {
		t.Fatalf("claimed record = %+v", rec)
	}
	// The attempt in flight lost its token: its completion is refused.
	err = s.KeyComplete(t.Context(), chargeonce.KeyCompleteParams{MerchantID: "m1", Key: "k", Token: p.Token,
		ChargeStatus: chargeonce.StatusCaptured, ResponseStatus: 201, ResponseBody: []byte(`{}`), TTL: longTTL})
	wantCode(t, "KeyComplete by the old token", err, chargeonce.ESTALE)

	rp := resolveParams(rec, "tok_operator", chargeonce.StatusDeclined, "alice")
	stored, err := o.ChargeResolve(t.Context(), rp)
	if err != nil {
		t.Fatalf("ChargeResolve: %v", err)
	}
	got := get(t, s, "m1", "k")
	if got.State != chargeonce.KeyCompleted || got.ResponseStatus != 402 || !bytes.Equal(got.ResponseBody, rp.Complete.ResponseBody) || got.ExpiresAt.IsZero() {
		t.Fatalf("resolved record = %+v", got)
	}
	checkCharge(t, "resolved charge", got.Charge, p.Charge, chargeonce.StatusDeclined, "operator_declined")
	audit, err := o.AuditList(t.Context(), chargeonce.AuditListParams{Limit: 10})
	if err != nil || len(audit) != 1 {
		t.Fatalf("audit trail = %+v, %v; want one entry", audit, err)
	}
	a := audit[0]
	if a.Actor != "admin:alice" || a.Reason != rp.Audit.Reason || a.Detail != rp.Audit.Detail || a.Outcome != "declined" || a.ChargeID != p.Charge.ID || a.At.IsZero() {
		t.Fatalf("audit entry = %+v", a)
	}
	// ChargeResolve answers the entry as stored: its id and time too.
	if stored.ID != a.ID || !stored.At.Equal(a.At) || stored.Actor != a.Actor || stored.Outcome != a.Outcome {
		t.Fatalf("ChargeResolve returned %+v, the trail holds %+v", stored, a)
	}
	h, err := o.ChargeHistory(t.Context(), p.Charge.ID)
	if err != nil || len(h) != 1 || h[0].ID != a.ID {
		t.Fatalf("history = %+v, %v; want the resolution", h, err)
	}
	// Resolving again: not processing, and nothing more is written.
	_, err = o.ChargeResolveClaim(t.Context(), p.Charge.ID, "tok_again", time.Minute)
	wantCode(t, "ChargeResolveClaim of a resolved charge", err, chargeonce.ENOTPROCESSING)
	_, err = o.ChargeResolve(t.Context(), rp)
	wantCode(t, "ChargeResolve again", err, chargeonce.ESTALE)
	if audit, _ := o.AuditList(t.Context(), chargeonce.AuditListParams{Limit: 10}); len(audit) != 1 {
		t.Fatalf("audit trail after a refused resolution holds %d entries, want 1", len(audit))
	}
	// Pages of the trail.
	if audit, _ := o.AuditList(t.Context(), chargeonce.AuditListParams{Limit: 10, Before: a.ID}); len(audit) != 0 {
		t.Fatalf("audit trail before the first entry = %+v", audit)
	}
	// A refused resolution is in the trail too, newest first; other history
	// is not.
	if err := o.HistoryAppend(t.Context(),
		chargeonce.HistoryEntry{ChargeID: p.Charge.ID, MerchantID: "m1", Kind: chargeonce.HistoryLookup, Actor: "recovery", Outcome: "unsure"},
		chargeonce.HistoryEntry{ChargeID: p.Charge.ID, MerchantID: "m1", Kind: chargeonce.HistoryResolveRefused, Actor: "admin:bob", Outcome: "refused: wanted captured", Reason: "ticket 9"},
	); err != nil {
		t.Fatalf("HistoryAppend: %v", err)
	}
	if audit, _ := o.AuditList(t.Context(), chargeonce.AuditListParams{Limit: 10}); len(audit) != 2 || audit[0].Kind != chargeonce.HistoryResolveRefused || audit[0].Actor != "admin:bob" || audit[1].ID != a.ID {
		t.Fatalf("audit trail with a refused resolution = %+v; want it first, then the resolution", audit)
	}
}

// testResolveClaimMeasuresQuiet (SPEC "Finality"): the claim says how long
// nothing was sent for the reference, by the database's clock: from the end
// of the lease or back-off it takes over. A back-off with time left is a
// negative Quiet; a lease that ended 300 ms ago is about 300 ms; and a
// hand-back that restores the lease (KeyLeaseSet by -Quiet) keeps the
// measure for the next claim, so an operator's refused attempt does not
// start the acceptance window again.
func testResolveClaimMeasuresQuiet(t *testing.T, s chargeonce.Store, o chargeonce.OperatorStore) {
	p := newIntent("m1", "k")
	insert(t, s, p)
	if err := s.KeyLeaseSet(t.Context(), "m1", "k", p.Token, 10*time.Minute, false); err != nil {
		t.Fatalf("KeyLeaseSet: %v", err)
	}
	rec, err := o.ChargeResolveClaim(t.Context(), p.Charge.ID, "tok_op1", time.Minute)
	if err != nil {
		t.Fatalf("ChargeResolveClaim: %v", err)
	}
	if rec.Quiet > -9*time.Minute || rec.Quiet < -10*time.Minute {
		t.Fatalf("Quiet over a back-off with 10 minutes left = %s, want about -10m", rec.Quiet)
	}
	// The operator hands it back with the back-off restored.
	if err := s.KeyLeaseSet(t.Context(), "m1", "k", "tok_op1", -rec.Quiet, false); err != nil {
		t.Fatalf("KeyLeaseSet (hand back): %v", err)
	}
	rec, err = o.ChargeResolveClaim(t.Context(), p.Charge.ID, "tok_op2", time.Minute)
	if err != nil {
		t.Fatalf("ChargeResolveClaim again: %v", err)
	}
	if rec.Quiet > -9*time.Minute {
		t.Fatalf("Quiet after a hand-back that restored the back-off = %s, want about -10m", rec.Quiet)
	}
	// A lease that ended 300 ms ago.
	if err := s.KeyLeaseSet(t.Context(), "m1", "k", "tok_op2", -300*time.Millisecond, false); err != nil {
		t.Fatalf("KeyLeaseSet: %v", err)
	}
	rec, err = o.ChargeResolveClaim(t.Context(), p.Charge.ID, "tok_op3", time.Minute)
	if err != nil {
		t.Fatalf("ChargeResolveClaim after the lease ended: %v", err)
	}
	if rec.Quiet < 300*time.Millisecond || rec.Quiet > time.Minute {
		t.Fatalf("Quiet 300 ms after the lease ended = %s", rec.Quiet)
	}
}

func testResolveNotProcessing(t *testing.T, s chargeonce.Store, o chargeonce.OperatorStore) {
	_, err := o.ChargeResolveClaim(t.Context(), "ch_nope", "tok", time.Minute)
	wantCode(t, "ChargeResolveClaim(unknown)", err, chargeonce.ENOTFOUND)
	p := newIntent("m1", "k")
	insert(t, s, p)
	complete(t, s, "m1", "k", p.Token, []byte(`{"settled":"by the attempt"}`))
	_, err = o.ChargeResolveClaim(t.Context(), p.Charge.ID, "tok", time.Minute)
	wantCode(t, "ChargeResolveClaim(settled)", err, chargeonce.ENOTPROCESSING)
	// A stale resolution writes no audit entry.
	_, err = o.ChargeResolve(t.Context(), resolveParams(chargeonce.KeyRecord{MerchantID: "m1", Key: "k", Charge: p.Charge}, "tok", chargeonce.StatusDeclined, "bob"))
	wantCode(t, "ChargeResolve(settled)", err, chargeonce.ESTALE)
	if h, err := o.ChargeHistory(t.Context(), p.Charge.ID); err != nil || len(h) != 0 {
		t.Fatalf("history after a stale resolution = %+v, %v; want none", h, err)
	}
	if got := get(t, s, "m1", "k"); string(got.ResponseBody) != `{"settled":"by the attempt"}` {
		t.Fatalf("the stale resolution changed the answer: %s", got.ResponseBody)
	}
}

func testResolveWritesOutbox(t *testing.T, s chargeonce.Store, o chargeonce.OperatorStore) {
	p := newIntent("m1", "queued")
	p.Lease = 0
	insert(t, s, p)
	if !notify(t, s, "m1", "queued") {
		t.Fatal("KeyNotify: flagged=false")
	}
	rec, err := o.ChargeResolveClaim(t.Context(), p.Charge.ID, "tok_op", time.Minute)
	if err != nil {
		t.Fatalf("ChargeResolveClaim: %v", err)
	}
	rp := resolveParams(rec, "tok_op", chargeonce.StatusCaptured, "carol")
	if _, err := o.ChargeResolve(t.Context(), rp); err != nil {
		t.Fatalf("ChargeResolve: %v", err)
	}
	es := claimAll(t, s, longLease)
	if len(es) != 1 || es[0].Key != "queued" || es[0].ResponseStatus != 201 || !bytes.Equal(es[0].ResponseBody, rp.Complete.ResponseBody) {
		t.Fatalf("outbox after a resolution = %+v; want the resolved answer once", es)
	}
}

// testResolveWritesOneWebhookEvent: an operator's resolution is a
// settlement like any other, so a merchant with an endpoint gets its one
// event, in the resolving transaction; a refused second resolution adds none.
func testResolveWritesOneWebhookEvent(t *testing.T, s chargeonce.Store, o chargeonce.OperatorStore) {
	addEndpoint(t, s, "m1")
	p := newIntent("m1", "stuck")
	p.Lease = 0
	insert(t, s, p)
	rec, err := o.ChargeResolveClaim(t.Context(), p.Charge.ID, "tok_op", time.Minute)
	if err != nil {
		t.Fatalf("ChargeResolveClaim: %v", err)
	}
	rp := resolveParams(rec, "tok_op", chargeonce.StatusDeclined, "dave")
	if _, err := o.ChargeResolve(t.Context(), rp); err != nil {
		t.Fatalf("ChargeResolve: %v", err)
	}
	_, err = o.ChargeResolve(t.Context(), rp)
	wantCode(t, "ChargeResolve again", err, chargeonce.ESTALE)
	es := events(t, s, "m1")
	if len(es) != 1 || es[0].ChargeID != p.Charge.ID || es[0].Type != "charge.declined" {
		t.Fatalf("events after a resolution = %+v; want one charge.declined for %s", es, p.Charge.ID)
	}
}

// testResolveWritesEventWithNoEnabledEndpoint resolves charges of a
// merchant with no endpoint and of one whose only endpoint is disabled: each
// resolution records the charge's one event, and no delivery.
func testResolveWritesEventWithNoEnabledEndpoint(t *testing.T, s chargeonce.Store, o chargeonce.OperatorStore) {
	disabling := disabledEndpoint(t, s, "m-disabled")
	for _, merchant := range []string{"m-disabled", "m-none"} {
		p := newIntent(merchant, "stuck")
		p.Lease = 0 // its attempt is gone: an operator may take it
		insert(t, s, p)
		rec, err := o.ChargeResolveClaim(t.Context(), p.Charge.ID, "tok_op", time.Minute)
		if err != nil {
			t.Fatalf("ChargeResolveClaim: %v", err)
		}
		if _, err := o.ChargeResolve(t.Context(), resolveParams(rec, "tok_op", chargeonce.StatusDeclined, "dave")); err != nil {
			t.Fatalf("ChargeResolve: %v", err)
		}
		want := map[string]string{p.Charge.ID: chargeonce.EventChargeDeclined}
		if merchant == "m-disabled" {
			want[disabling.Charge.ID] = chargeonce.EventChargeCaptured
		}
		wantEvents(t, s, merchant, want)
	}
	if ds := claimDeliveries(t, s, longLease); len(ds) != 0 {
		t.Fatalf("claimed %d deliveries; want none: no endpoint is enabled", len(ds))
	}
}

// testResolveRacesCompletion races, for each of 20 processing records, an
// operator's claim and resolution against recovery's claim and completion:
// exactly one of them settles each record, and there is one audit entry per
// resolution that succeeded.
func testResolveRacesCompletion(t *testing.T, s chargeonce.Store, o chargeonce.OperatorStore) {
	const n = 20
	var recs []chargeonce.KeyInsertParams
	for i := range n {
		p := newIntent("m1", fmt.Sprintf("race-%d", i))
		p.Lease = 0 // orphaned at once: recovery may claim it
		insert(t, s, p)
		recs = append(recs, p)
	}
	var (
		resolved, recovered atomic.Int64
		wg                  sync.WaitGroup
		start               = make(chan struct{})
	)
	// Recovery claims the oldest leases first; the operator works from the
	// newest, so the two meet in the middle.
	for i, p := range slices.Backward(recs) {
		wg.Go(func() {
			<-start
			time.Sleep(time.Duration(i%4) * 5 * time.Millisecond) // spread the operator's clicks
			tok := "tok_op_" + randHex(4)
			rec, err := o.ChargeResolveClaim(t.Context(), p.Charge.ID, tok, time.Minute)
			if code := chargeonce.ErrorCode(err); code == chargeonce.ENOTPROCESSING || code == chargeonce.ELEASED {
				return // settled first, or recovery holds it
			}
			if err != nil {
				t.Errorf("ChargeResolveClaim: %v", err)
				return
			}
			_, err = o.ChargeResolve(t.Context(), resolveParams(rec, tok, chargeonce.StatusCaptured, "dave"))
			switch {
			case err == nil:
				resolved.Add(1)
			case chargeonce.ErrorCode(err) != chargeonce.ESTALE:
				t.Errorf("ChargeResolve: %v", err)
			}
		})
	}
	for range 4 {
		wg.Go(func() {
			<-start
			for range n {
				claimed, err := s.KeysClaimExpired(t.Context(), time.Minute, 3)
				if err != nil {
					t.Errorf("KeysClaimExpired: %v", err)
					return
				}
				for _, rec := range claimed {
					err := s.KeyComplete(t.Context(), chargeonce.KeyCompleteParams{MerchantID: rec.MerchantID, Key: rec.Key, Token: rec.Token,
						ChargeStatus: chargeonce.StatusCaptured, ResponseStatus: 201, ResponseBody: []byte(`{"by":"recovery"}`), TTL: longTTL})
					switch {
					case err == nil:
						recovered.Add(1)
					case chargeonce.ErrorCode(err) != chargeonce.ESTALE:
						t.Errorf("KeyComplete: %v", err)
					}
				}
			}
		})
	}
	close(start)
	wg.Wait()
	if got := resolved.Load() + recovered.Load(); got != n {
		t.Fatalf("%d resolved + %d recovered = %d settlements of %d records, want exactly %d", resolved.Load(), recovered.Load(), got, n, n)
	}
	audit, err := o.AuditList(t.Context(), chargeonce.AuditListParams{Limit: chargeonce.StuckListMaxLimit})
	if err != nil || int64(len(audit)) != resolved.Load() {
		t.Fatalf("audit trail holds %d entries (%v), want one per resolution: %d", len(audit), err, resolved.Load())
	}
	for _, p := range recs {
		if rec := get(t, s, "m1", p.Charge.IdempotencyKey); rec.State != chargeonce.KeyCompleted || rec.Charge.Status != chargeonce.StatusCaptured {
			t.Fatalf("record %s = %s/%s after the race", p.Charge.IdempotencyKey, rec.State, rec.Charge.Status)
		}
	}
	t.Logf("%d records: %d settled by resolutions, %d by recovery, %d audit entries", n, resolved.Load(), recovered.Load(), len(audit))
}

// testResolveNeverTakesALiveLease: an attempt or recovery pass driving a
// charge under its lease may still capture it, so a resolution's claim is
// refused (ELEASED, with the lease's time left) and changes nothing; a
// recovery pass that claimed it holds it the same way.
func testResolveNeverTakesALiveLease(t *testing.T, s chargeonce.Store, o chargeonce.OperatorStore) {
	p := newIntent("m1", "in-flight")
	insert(t, s, p) // its lease runs for an hour: the attempt is at the acquirer
	_, err := o.ChargeResolveClaim(t.Context(), p.Charge.ID, "tok_operator", time.Minute)
	wantCode(t, "ChargeResolveClaim of a live lease", err, chargeonce.ELEASED)
	if ra := chargeonce.ErrorRetryAfter(err); ra < longLease-time.Minute || ra > longLease {
		t.Fatalf("RetryAfter = %v, want the lease's time left (about %v)", ra, longLease)
	}
	got := get(t, s, "m1", "in-flight")
	if got.Token != p.Token || !got.LeaseHeld {
		t.Fatalf("the refused claim changed the record: %+v", got)
	}
	// The attempt still completes: nobody took it over.
	complete(t, s, "m1", "in-flight", p.Token, []byte(`{"by":"the attempt"}`))

	// Recovery's claim holds the lease just as the attempt's did.
	q := newIntent("m1", "recovering")
	q.Lease = 0
	insert(t, s, q)
	rec, claimed, err := s.KeyClaim(t.Context(), "m1", "recovering", "tok_recovery", longLease)
	if err != nil || !claimed || !rec.LeaseHeld {
		t.Fatalf("KeyClaim = %+v, %v, %v", rec, claimed, err)
	}
	_, err = o.ChargeResolveClaim(t.Context(), q.Charge.ID, "tok_operator", time.Minute)
	wantCode(t, "ChargeResolveClaim of recovery's lease", err, chargeonce.ELEASED)
	// Once recovery lets go (a back-off), the operator may take it.
	if err := s.KeyLeaseSet(t.Context(), "m1", "recovering", "tok_recovery", longLease, true); err != nil {
		t.Fatalf("KeyLeaseSet: %v", err)
	}
	if got := get(t, s, "m1", "recovering"); got.LeaseHeld || got.LeaseExpired {
		t.Fatalf("after the hand-off: held %v expired %v, want a back-off nobody holds", got.LeaseHeld, got.LeaseExpired)
	}
	if _, err := o.ChargeResolveClaim(t.Context(), q.Charge.ID, "tok_operator", time.Minute); err != nil {
		t.Fatalf("ChargeResolveClaim in back-off: %v", err)
	}
}

// testAcquirerIDAndAge: the acquirer's id recorded for a processing record
// is read back by every read and claim, only its owner may record it, and a
// record's age is measured by the database's clock.
func testAcquirerIDAndAge(t *testing.T, s chargeonce.Store, o chargeonce.OperatorStore) {
	p := newIntent("m1", "k")
	p.Lease = 0
	insert(t, s, p)
	wantCode(t, "KeyAcquirerIDSet by a stranger", s.KeyAcquirerIDSet(t.Context(), "m1", "k", "tok_nobody", "pi_1"), chargeonce.ESTALE)
	if err := s.KeyAcquirerIDSet(t.Context(), "m1", "k", p.Token, "pi_123"); err != nil {
		t.Fatalf("KeyAcquirerIDSet: %v", err)
	}
	if got := get(t, s, "m1", "k"); got.AcquirerID != "pi_123" {
		t.Fatalf("AcquirerID = %q, want pi_123", got.AcquirerID)
	}
	recs, err := s.KeysClaimExpired(t.Context(), longLease, 10)
	if err != nil || len(recs) != 1 || recs[0].AcquirerID != "pi_123" {
		t.Fatalf("KeysClaimExpired = %+v, %v; want the record with its acquirer id", recs, err)
	}
	time.Sleep(50 * time.Millisecond)
	got := get(t, s, "m1", "k")
	// The age is now() - created_at by the database's clock; created_at is
	// the database's too, so the two agree with each other whatever this
	// process's clock says.
	if got.Age < 50*time.Millisecond || got.Age > 30*time.Second {
		t.Fatalf("Age = %v, want the time since the insert (>= 50ms)", got.Age)
	}
	complete(t, s, "m1", "k", recs[0].Token, []byte(`{}`))
	wantCode(t, "KeyAcquirerIDSet once completed", s.KeyAcquirerIDSet(t.Context(), "m1", "k", recs[0].Token, "pi_2"), chargeonce.ESTALE)
}

// testStuckOperationsListedAndResolved: a manual capture or a cancel
// (void) whose outcome is pending and that nobody drives is listed as its
// own kind with the authorized charge it settles (its amount, currency and
// age the operation's), after what is older; one under a live lease is
// left out unless asked. An operator's claim takes it (and not one under
// a live lease); the resolution settles it with the statement captures
// and cancels settle with (the charge captured for the operation's
// amount, its charge.captured event written once) and appends the audit
// entry under the operation's id, once.
func testStuckOperationsListedAndResolved(t *testing.T, s chargeonce.Store, o chargeonce.OperatorStore) {
	m := "ops-" + randHex(4)
	capCharge := authorizedCharge(t, s, m, 1000)
	stuck := newOperation(capCharge, chargeonce.KindCapture, "cp-stuck", 600)
	stuck.Lease = time.Millisecond
	insertOperation(t, s, stuck)
	liveCharge := authorizedCharge(t, s, m, 800)
	live := newOperation(liveCharge, chargeonce.KindCancel, "vd-live", 0)
	insertOperation(t, s, live)
	voidCharge := authorizedCharge(t, s, m, 500)
	void := newOperation(voidCharge, chargeonce.KindCancel, "vd-stuck", 0)
	void.Lease = time.Millisecond
	insertOperation(t, s, void)
	time.Sleep(20 * time.Millisecond)

	if got, want := stuckIDs(t, o, chargeonce.StuckListParams{MerchantID: m, Limit: 1}), []string{stuck.Operation.ID, void.Operation.ID}; !slices.Equal(got, want) {
		t.Fatalf("stuck list in pages of 1 = %v, want %v (the cancel under a live lease left out)", got, want)
	}
	page, err := o.ChargesListStuck(t.Context(), chargeonce.StuckListParams{MerchantID: m, Limit: 50, IncludeLeased: true})
	if err != nil || len(page.Charges) != 3 {
		t.Fatalf("with IncludeLeased: %+v, %v; want 3 rows", page.Charges, err)
	}
	r := page.Charges[0]
	if r.Kind() != chargeonce.KindCapture || r.ObjectID() != stuck.Operation.ID || r.Refund != nil || r.Charge.ID != capCharge.ID ||
		r.Charge.Status != chargeonce.StatusAuthorized || r.Operation.AmountCents != 600 || r.Operation.Currency != capCharge.Currency ||
		r.Operation.Status != chargeonce.OperationPending || r.Operation.ChargeID != capCharge.ID || r.InFlight || r.Age < 0 || r.Age > time.Minute {
		t.Fatalf("the stuck capture's row: %+v (operation %+v)", r, r.Operation)
	}
	if l, v := page.Charges[1], page.Charges[2]; l.Kind() != chargeonce.KindCancel || !l.InFlight || l.ObjectID() != live.Operation.ID ||
		v.Kind() != chargeonce.KindCancel || v.Operation.AmountCents != 500 || v.InFlight {
		t.Fatalf("the cancels' rows: %+v %+v", l.Operation, v.Operation)
	}

	in, err := o.OperationInspect(t.Context(), stuck.Operation.ID)
	if err != nil || in.Operation.ID != stuck.Operation.ID || in.Operation.Kind != chargeonce.KindCapture || in.Operation.AmountCents != 600 ||
		in.Charge.ID != capCharge.ID || in.Charge.Status != chargeonce.StatusAuthorized || !in.HasRecord || in.State != chargeonce.KeyProcessing ||
		in.InFlight || in.Age < 0 || in.Age > time.Minute {
		t.Fatalf("OperationInspect of the stuck capture = %+v, %v", in, err)
	}
	if ops, err := o.ChargeOperations(t.Context(), capCharge.ID); err != nil || len(ops) != 1 || ops[0].ID != stuck.Operation.ID || ops[0].AmountCents != 600 {
		t.Fatalf("ChargeOperations of the capture's charge = %+v, %v", ops, err)
	}
	if ops, err := o.ChargeOperations(t.Context(), "ch_nope"); err != nil || len(ops) != 0 {
		t.Fatalf("ChargeOperations of no charge = %+v, %v", ops, err)
	}
	if in, err := o.OperationInspect(t.Context(), live.Operation.ID); err != nil || !in.InFlight {
		t.Fatalf("OperationInspect of the live cancel = %+v, %v; want it in flight", in, err)
	}
	for _, id := range []string{"cp_nope", "vd_nope", capCharge.ID} {
		_, err := o.OperationInspect(t.Context(), id)
		wantCode(t, "OperationInspect("+id+")", err, chargeonce.ENOTFOUND)
	}

	_, err = o.ChargeResolveClaim(t.Context(), live.Operation.ID, "tok_op", time.Minute)
	wantCode(t, "claiming a cancel under a live lease", err, chargeonce.ELEASED)
	for _, id := range []string{"cp_nope", "vd_nope"} {
		_, err = o.ChargeResolveClaim(t.Context(), id, "tok_op", time.Minute)
		wantCode(t, "claiming "+id, err, chargeonce.ENOTFOUND)
	}
	// The charge the capture settles is authorized, not processing: its
	// own id claims nothing.
	_, err = o.ChargeResolveClaim(t.Context(), capCharge.ID, "tok_op", time.Minute)
	wantCode(t, "claiming the authorized charge", err, chargeonce.ENOTPROCESSING)
	rec, err := o.ChargeResolveClaim(t.Context(), stuck.Operation.ID, "tok_op", time.Minute)
	if err != nil || rec.Operation == nil || rec.Operation.ID != stuck.Operation.ID || rec.Token != "tok_op" || rec.Kind() != chargeonce.KindCapture {
		t.Fatalf("claiming the stuck capture: %+v, %v", rec, err)
	}
	resolve := func(status chargeonce.OperationStatus) chargeonce.ResolveParams {
		return chargeonce.ResolveParams{
			Complete: chargeonce.KeyCompleteParams{
				Kind: chargeonce.KindCapture, MerchantID: m, Key: rec.Key, Token: "tok_op",
				OperationStatus: status, ResponseStatus: 200, ResponseBody: []byte(`{"status":"captured"}`), TTL: time.Hour,
			},
			Audit: chargeonce.HistoryEntry{ChargeID: stuck.Operation.ID, MerchantID: m, Kind: chargeonce.HistoryResolution,
				Actor: "admin:alice", Outcome: string(status), Reason: "ticket 10"},
		}
	}
	_, err = o.ChargeResolve(t.Context(), resolve(chargeonce.OperationPending))
	wantCode(t, "resolving a capture as pending", err, chargeonce.EINVALID)
	audit, err := o.ChargeResolve(t.Context(), resolve(chargeonce.OperationSucceeded))
	if err != nil || audit.ID == 0 || audit.ChargeID != stuck.Operation.ID {
		t.Fatalf("resolving the capture: %+v, %v", audit, err)
	}
	if ch := chargeNow(t, s, capCharge); ch.Status != chargeonce.StatusCaptured || ch.CapturedCents != 600 {
		t.Fatalf("the charge after its capture's resolution: %s, captured %d; want captured 600", ch.Status, ch.CapturedCents)
	}
	if got := get(t, s, m, "cp-stuck"); got.State != chargeonce.KeyCompleted || string(got.ResponseBody) != `{"status":"captured"}` ||
		got.Operation == nil || got.Operation.Status != chargeonce.OperationSucceeded || got.ExpiresAt.IsZero() {
		t.Fatalf("the capture's record after the resolution: %+v (operation %+v)", got, got.Operation)
	}
	_, err = o.ChargeResolve(t.Context(), resolve(chargeonce.OperationSucceeded))
	wantCode(t, "resolving the capture again", err, chargeonce.ESTALE)
	_, err = o.ChargeResolveClaim(t.Context(), stuck.Operation.ID, "tok_op2", time.Minute)
	wantCode(t, "claiming a settled capture", err, chargeonce.ENOTPROCESSING)
	wantEvents(t, s, m, map[string]string{capCharge.ID: chargeonce.EventChargeCaptured})
	h, err := o.ChargeHistory(t.Context(), stuck.Operation.ID)
	if err != nil || len(h) != 1 || h[0].Kind != chargeonce.HistoryResolution || h[0].Reason != "ticket 10" {
		t.Fatalf("the capture's history: %+v, %v", h, err)
	}
	if in, err := o.OperationInspect(t.Context(), stuck.Operation.ID); err != nil || in.Operation.Status != chargeonce.OperationSucceeded ||
		in.State != chargeonce.KeyCompleted || in.Charge.Status != chargeonce.StatusCaptured || in.UpdatedAt.Before(in.Operation.CreatedAt) {
		t.Fatalf("OperationInspect of the resolved capture = %+v, %v", in, err)
	}

	// The stuck void, resolved succeeded: the charge is canceled, with
	// its one charge.canceled event.
	vrec, err := o.ChargeResolveClaim(t.Context(), void.Operation.ID, "tok_void", time.Minute)
	if err != nil || vrec.Kind() != chargeonce.KindCancel {
		t.Fatalf("claiming the stuck cancel: %+v, %v", vrec, err)
	}
	if _, err := o.ChargeResolve(t.Context(), chargeonce.ResolveParams{
		Complete: chargeonce.KeyCompleteParams{Kind: chargeonce.KindCancel, MerchantID: m, Key: vrec.Key, Token: "tok_void",
			OperationStatus: chargeonce.OperationSucceeded, ResponseStatus: 200, ResponseBody: []byte(`{"status":"canceled"}`), TTL: time.Hour},
		Audit: chargeonce.HistoryEntry{ChargeID: void.Operation.ID, MerchantID: m, Kind: chargeonce.HistoryResolution, Actor: "admin:alice", Outcome: "succeeded", Reason: "ticket 11"},
	}); err != nil {
		t.Fatalf("resolving the cancel: %v", err)
	}
	if ch := chargeNow(t, s, voidCharge); ch.Status != chargeonce.StatusCanceled {
		t.Fatalf("the charge after its cancel's resolution: %s, want canceled", ch.Status)
	}
	wantEvents(t, s, m, map[string]string{capCharge.ID: chargeonce.EventChargeCaptured, voidCharge.ID: chargeonce.EventChargeCanceled})
	if a, err := o.AuditList(t.Context(), chargeonce.AuditListParams{Limit: 10}); err != nil || len(a) != 2 || a[0].ChargeID != void.Operation.ID || a[1].ChargeID != stuck.Operation.ID {
		t.Fatalf("audit trail = %+v, %v; want the cancel's resolution, then the capture's", a, err)
	}
}

// testStuckOperationFailedFreesCharge: a stuck capture resolved failed
// (the acquirer refused it) leaves its charge authorized, with no event,
// and free for another capture, as a failed capture from the acquirer
// does.
func testStuckOperationFailedFreesCharge(t *testing.T, s chargeonce.Store, o chargeonce.OperatorStore) {
	m := "opf-" + randHex(4)
	ch := authorizedCharge(t, s, m, 1000)
	p := newOperation(ch, chargeonce.KindCapture, "cp-fail", 0)
	p.Lease = 0
	insertOperation(t, s, p)
	rec, err := o.ChargeResolveClaim(t.Context(), p.Operation.ID, "tok_op", time.Minute)
	if err != nil {
		t.Fatalf("ChargeResolveClaim: %v", err)
	}
	if _, err := o.ChargeResolve(t.Context(), chargeonce.ResolveParams{
		Complete: chargeonce.KeyCompleteParams{Kind: chargeonce.KindCapture, MerchantID: m, Key: rec.Key, Token: "tok_op",
			OperationStatus: chargeonce.OperationFailed, FailureReason: "operator_failed", ResponseStatus: 402, ResponseBody: []byte(`{"status":402}`), TTL: time.Hour},
		Audit: chargeonce.HistoryEntry{ChargeID: p.Operation.ID, MerchantID: m, Kind: chargeonce.HistoryResolution, Actor: "admin:bob", Outcome: "failed (operator_failed)", Reason: "ticket 12"},
	}); err != nil {
		t.Fatalf("resolving the capture failed: %v", err)
	}
	if got := chargeNow(t, s, ch); got.Status != chargeonce.StatusAuthorized {
		t.Fatalf("the charge after its capture was resolved failed: %s, want authorized", got.Status)
	}
	if in, err := o.OperationInspect(t.Context(), p.Operation.ID); err != nil || in.Operation.Status != chargeonce.OperationFailed || in.Operation.FailureReason != "operator_failed" {
		t.Fatalf("the failed capture: %+v, %v", in.Operation, err)
	}
	if es := events(t, s, m); len(es) != 0 {
		t.Fatalf("events after a failed capture's resolution: %+v; want none", es)
	}
	if ops, err := o.ChargeOperations(t.Context(), ch.ID); err != nil || len(ops) != 0 {
		t.Fatalf("ChargeOperations after the failed capture = %+v, %v; want none holding the charge", ops, err)
	}
	again := insertOperation(t, s, newOperation(ch, chargeonce.KindCapture, "cp-again", 0))
	if ops, err := o.ChargeOperations(t.Context(), ch.ID); err != nil || len(ops) != 1 || ops[0].ID != again.Operation.ID || ops[0].Status != chargeonce.OperationPending {
		t.Fatalf("ChargeOperations = %+v, %v; want the new capture", ops, err)
	}
}

// testResolveOperationRacesRecovery races, for each of 12 stuck captures,
// an operator's claim and resolution against recovery's claim and
// completion: exactly one settles each, each charge has one
// charge.captured event, and one audit entry per resolution that settled.
func testResolveOperationRacesRecovery(t *testing.T, s chargeonce.Store, o chargeonce.OperatorStore) {
	const n = 12
	m := "opr-" + randHex(4)
	var ops []chargeonce.OperationInsertParams
	want := map[string]string{}
	for i := range n {
		ch := authorizedCharge(t, s, m, 100)
		p := newOperation(ch, chargeonce.KindCapture, fmt.Sprintf("race-%d", i), 0)
		p.Lease = 0
		insertOperation(t, s, p)
		ops = append(ops, p)
		want[ch.ID] = chargeonce.EventChargeCaptured
	}
	var (
		resolved, recovered atomic.Int64
		wg                  sync.WaitGroup
		start               = make(chan struct{})
	)
	for i, p := range slices.Backward(ops) {
		wg.Go(func() {
			<-start
			time.Sleep(time.Duration(i%4) * 5 * time.Millisecond)
			tok := "tok_op_" + randHex(4)
			rec, err := o.ChargeResolveClaim(t.Context(), p.Operation.ID, tok, time.Minute)
			if code := chargeonce.ErrorCode(err); code == chargeonce.ENOTPROCESSING || code == chargeonce.ELEASED {
				return
			}
			if err != nil {
				t.Errorf("ChargeResolveClaim: %v", err)
				return
			}
			_, err = o.ChargeResolve(t.Context(), chargeonce.ResolveParams{
				Complete: chargeonce.KeyCompleteParams{Kind: rec.Kind(), MerchantID: m, Key: rec.Key, Token: tok,
					OperationStatus: chargeonce.OperationSucceeded, ResponseStatus: 200, ResponseBody: []byte(`{"by":"operator"}`), TTL: longTTL},
				Audit: chargeonce.HistoryEntry{ChargeID: p.Operation.ID, MerchantID: m, Kind: chargeonce.HistoryResolution, Actor: "admin:dave", Outcome: "succeeded", Reason: "race"},
			})
			switch {
			case err == nil:
				resolved.Add(1)
			case chargeonce.ErrorCode(err) != chargeonce.ESTALE:
				t.Errorf("ChargeResolve: %v", err)
			}
		})
	}
	for range 4 {
		wg.Go(func() {
			<-start
			for range n {
				claimed, err := s.KeysClaimExpired(t.Context(), time.Minute, 3)
				if err != nil {
					t.Errorf("KeysClaimExpired: %v", err)
					return
				}
				for _, rec := range claimed {
					if rec.MerchantID != m {
						continue
					}
					err := completeOperation(t, s, rec, rec.Token, chargeonce.OperationSucceeded)
					switch {
					case err == nil:
						recovered.Add(1)
					case chargeonce.ErrorCode(err) != chargeonce.ESTALE:
						t.Errorf("KeyComplete: %v", err)
					}
				}
			}
		})
	}
	close(start)
	wg.Wait()
	if got := resolved.Load() + recovered.Load(); got != n {
		t.Fatalf("%d resolved + %d recovered = %d settlements of %d captures, want exactly %d", resolved.Load(), recovered.Load(), got, n, n)
	}
	audit, err := o.AuditList(t.Context(), chargeonce.AuditListParams{Limit: chargeonce.StuckListMaxLimit})
	if err != nil || int64(len(audit)) != resolved.Load() {
		t.Fatalf("audit trail holds %d entries (%v), want one per resolution: %d", len(audit), err, resolved.Load())
	}
	wantEvents(t, s, m, want)
	t.Logf("%d stuck captures: %d settled by resolutions, %d by recovery", n, resolved.Load(), recovered.Load())
}
