package recon_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/idempotency"
	"github.com/chargeonce/chargeonce/recon"
)

// authorize makes one charge with manual capture through the engine and
// returns its id; the acquirer holds 2500 for it.
func (e *env) authorize(t *testing.T) string {
	t.Helper()
	req := &chargeonce.ChargeRequest{OrderID: orderSeq.Add(1), AmountCents: 2500, PaymentToken: acquirer.TokenOK, CaptureMethod: chargeonce.CaptureManual}
	if err := req.Normalize(); err != nil {
		t.Fatal(err)
	}
	res, err := e.eng.Charge(t.Context(), "demo", fmt.Sprintf("key-%d", req.OrderID), req)
	if err != nil {
		t.Fatalf("authorizing: %v", err)
	}
	var body struct {
		ID     string `json:"id"`
		Status string `json:"status"`
	}
	if err := json.Unmarshal(res.Body, &body); err != nil || body.Status != string(chargeonce.StatusAuthorized) {
		t.Fatalf("authorizing: %d %s", res.Status, res.Body)
	}
	return body.ID
}

// settle captures amount of the authorization id (kind KindCapture) or
// voids it (KindCancel) through the engine, as POST
// /v1/charges/{id}/capture or /cancel would.
func (e *env) settle(t *testing.T, id string, kind chargeonce.RecordKind, amount int64) {
	t.Helper()
	key := "op-" + idempotency.NewToken()
	var (
		res engine.Response
		err error
	)
	if kind == chargeonce.KindCancel {
		res, err = e.eng.Cancel(t.Context(), "demo", id, key)
	} else {
		res, err = e.eng.Capture(t.Context(), "demo", id, key, &chargeonce.CaptureBody{AmountCents: amount})
	}
	if err != nil || res.Status != 200 {
		t.Fatalf("%s of %s: %d %s %v", kind, id, res.Status, res.Body, err)
	}
}

// recordOp stores a capture (of amount) or a cancel of the authorization
// chargeID the way the engine does, succeeded, without calling the
// acquirer: what a bug (or an edited row) leaves. It returns the
// operation's id.
func (e *env) recordOp(t *testing.T, chargeID string, kind chargeonce.RecordKind, amount int64) string {
	t.Helper()
	return e.recordOpAs(t, chargeID, kind, amount, chargeonce.OperationSucceeded)
}

// recordOpAs is recordOp settling the operation as status (pending: left
// as inserted, its outcome unknown to us).
func (e *env) recordOpAs(t *testing.T, chargeID string, kind chargeonce.RecordKind, amount int64, status chargeonce.OperationStatus) string {
	t.Helper()
	token := idempotency.NewToken()
	rec, inserted, err := e.store.OperationInsert(t.Context(), chargeonce.OperationInsertParams{
		Fingerprint: "fp", Token: token, Lease: time.Minute,
		Operation: chargeonce.Operation{
			ID: idempotency.NewOperationID(kind), Kind: kind, MerchantID: "demo", IdempotencyKey: "orec-" + token,
			ChargeID: chargeID, AmountCents: amount,
		},
	})
	if err != nil || !inserted {
		t.Fatalf("OperationInsert: inserted=%v err=%v", inserted, err)
	}
	if status == chargeonce.OperationPending {
		return rec.Operation.ID
	}
	if err := e.store.KeyComplete(t.Context(), chargeonce.KeyCompleteParams{
		Kind: rec.Kind(), MerchantID: rec.MerchantID, Key: rec.Key, Token: token,
		OperationStatus: status, ResponseStatus: 200, ResponseBody: []byte(`{}`), TTL: time.Hour,
	}); err != nil {
		t.Fatalf("KeyComplete: %v", err)
	}
	return rec.Operation.ID
}

// settleAtAcquirer captures amount of the authorization chargeRef, or
// voids it, straight at the simulator under the operation reference ref,
// as a broken build (or another system holding our credentials) would.
func (e *env) settleAtAcquirer(t *testing.T, kind chargeonce.LedgerKind, ref, chargeRef string, amount int64) {
	t.Helper()
	call := chargeonce.OperationCall{Reference: ref, ChargeReference: chargeRef, Merchant: "demo", AmountCents: amount, Currency: "BRL"}
	var (
		res chargeonce.OperationResult
		err error
	)
	if kind == chargeonce.LedgerVoid {
		res, err = e.sim.Void(t.Context(), call)
	} else {
		res, err = e.sim.CaptureAuthorized(t.Context(), call)
	}
	if err != nil || res.Status != chargeonce.OperationSucceeded {
		t.Fatalf("%s of %s at the simulator: %+v %v", kind, chargeRef, res, err)
	}
}

// A day of manual captures (whole and partial), voids, authorizations
// still open, a refund of a partial capture, a capture that failed before
// another succeeded, and an authorization at the acquirer that we do not
// know (no money moved), beside automatic charges, reconciles clean.
func TestManualCapturesAndVoidsReconcileClean(t *testing.T) {
	t.Parallel()
	for _, kind := range kinds {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			e := setup(t, kind, acquirer.Options{})
			e.background(t, 4)
			e.authorize(t) // still open: no money moved
			whole, partial, voided := e.authorize(t), e.authorize(t), e.authorize(t)
			e.settle(t, whole, chargeonce.KindCapture, 0)
			e.settle(t, partial, chargeonce.KindCapture, 1000)
			e.settle(t, voided, chargeonce.KindCancel, 0)
			e.refund(t, partial, 1000)
			// A capture that failed moved nothing: not read, not compared.
			retried := e.authorize(t)
			e.recordOpAs(t, retried, chargeonce.KindCapture, 2500, chargeonce.OperationFailed)
			e.settle(t, retried, chargeonce.KindCapture, 0)
			if res, err := e.sim.Authorize(t.Context(), chargeonce.CaptureRequest{
				Reference: idempotency.NewChargeID(), OrderID: orderSeq.Add(1), Merchant: "demo", AmountCents: 700, Currency: "BRL", PaymentToken: acquirer.TokenOK,
			}); err != nil || res.Status != chargeonce.StatusAuthorized {
				t.Fatalf("authorizing at the simulator: %+v %v", res, err)
			}
			for _, page := range []int{1, 2, 7, 1000} {
				rep := e.run(t, 0, page)
				wantOnly(t, rep, nil)
				// 9 charges, 4 operations, 1 refund; the ledger: 4 captures,
				// 6 authorizations, 3 captures of them, 1 void, 1 refund.
				if rep.Charges != 9 || rep.Operations != 4 || rep.Refunds != 1 || rep.LedgerEntries != 15 || rep.Matched != 10 {
					t.Errorf("page %d: charges=%d operations=%d refunds=%d ledger=%d matched=%d, want 9 4 1 15 10",
						page, rep.Charges, rep.Operations, rep.Refunds, rep.LedgerEntries, rep.Matched)
				}
			}
		})
	}
}

// Each difference in how an authorization was settled is reported once,
// on the charge, naming the operation.
func TestEachOperationMismatchReportedOnce(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		window time.Duration
		// inject acts on the authorization charge and returns the
		// operation reference the mismatch names.
		inject func(t *testing.T, e *env, charge string) string
		want   map[recon.Type]int
		kind   chargeonce.LedgerKind
	}{
		{
			name: "voided by us, captured by the acquirer",
			inject: func(t *testing.T, e *env, charge string) string {
				op := e.recordOp(t, charge, chargeonce.KindCancel, 0)
				e.settleAtAcquirer(t, chargeonce.LedgerManualCapture, idempotency.NewOperationID(chargeonce.KindCapture), charge, 2500)
				return op
			},
			want: map[recon.Type]int{recon.StatusMismatch: 1},
			kind: chargeonce.LedgerVoid,
		},
		{
			name: "captured by us, voided by the acquirer",
			inject: func(t *testing.T, e *env, charge string) string {
				op := e.recordOp(t, charge, chargeonce.KindCapture, 2500)
				e.settleAtAcquirer(t, chargeonce.LedgerVoid, idempotency.NewOperationID(chargeonce.KindCancel), charge, 2500)
				return op
			},
			want: map[recon.Type]int{recon.StatusMismatch: 1},
			kind: chargeonce.LedgerManualCapture,
		},
		{
			name: "captured amount differs",
			inject: func(t *testing.T, e *env, charge string) string {
				op := e.recordOp(t, charge, chargeonce.KindCapture, 1000)
				e.settleAtAcquirer(t, chargeonce.LedgerManualCapture, op, charge, 1500)
				return op
			},
			want: map[recon.Type]int{recon.AmountMismatch: 1},
			kind: chargeonce.LedgerManualCapture,
		},
		{
			name: "a capture of the authorization we never recorded",
			inject: func(t *testing.T, e *env, charge string) string {
				op := idempotency.NewOperationID(chargeonce.KindCapture)
				e.settleAtAcquirer(t, chargeonce.LedgerManualCapture, op, charge, 2500)
				return op
			},
			want: map[recon.Type]int{recon.MissingInternal: 1},
			kind: chargeonce.LedgerManualCapture,
		},
		{
			name: "a void missing at the acquirer",
			inject: func(t *testing.T, e *env, charge string) string {
				return e.recordOp(t, charge, chargeonce.KindCancel, 0)
			},
			want: map[recon.Type]int{recon.MissingAtAcquirer: 1},
			kind: chargeonce.LedgerVoid,
		},
		{
			name:   "a void not at the acquirer yet, within the window",
			window: time.Hour,
			inject: func(t *testing.T, e *env, charge string) string {
				return e.recordOp(t, charge, chargeonce.KindCancel, 0)
			},
			want: map[recon.Type]int{recon.Pending: 1},
			kind: chargeonce.LedgerVoid,
		},
		{
			name: "our capture still pending past the window, captured by the acquirer",
			inject: func(t *testing.T, e *env, charge string) string {
				op := e.recordOpAs(t, charge, chargeonce.KindCapture, 2500, chargeonce.OperationPending)
				e.settleAtAcquirer(t, chargeonce.LedgerManualCapture, op, charge, 2500)
				return op
			},
			want: map[recon.Type]int{recon.StatusMismatch: 1},
			kind: chargeonce.LedgerManualCapture,
		},
		{
			name:   "our void pending within the window, voided by the acquirer",
			window: time.Hour,
			inject: func(t *testing.T, e *env, charge string) string {
				op := e.recordOpAs(t, charge, chargeonce.KindCancel, 0, chargeonce.OperationPending)
				e.settleAtAcquirer(t, chargeonce.LedgerVoid, op, charge, 2500)
				return op
			},
			want: map[recon.Type]int{recon.Pending: 1},
			kind: chargeonce.LedgerVoid,
		},
		{
			name: "a capture missing at the acquirer",
			inject: func(t *testing.T, e *env, charge string) string {
				return e.recordOp(t, charge, chargeonce.KindCapture, 2000)
			},
			want: map[recon.Type]int{recon.MissingAtAcquirer: 1},
			kind: chargeonce.LedgerManualCapture,
		},
		{
			name: "refunds at the acquirer exceed the captured amount, not the authorized one",
			inject: func(t *testing.T, e *env, charge string) string {
				e.settle(t, charge, chargeonce.KindCapture, 1000)
				rf := e.recordRefund(t, charge, 1000, chargeonce.RefundSucceeded)
				e.ledgerRefund(rf.ID, charge, 1000, "BRL", "succeeded")
				e.ledgerRefund(idempotency.NewRefundID(), charge, 500, "BRL", "succeeded")
				return ""
			},
			// The second refund is one we never made, and with it 1,500
			// went back of the 1,000 captured (of 2,500 authorized).
			want: map[recon.Type]int{recon.MissingInternal: 1, recon.RefundsExceedCapture: 1},
			kind: chargeonce.LedgerRefund,
		},
	}
	for _, kind := range kinds {
		for _, tc := range cases {
			t.Run(kind+"/"+tc.name, func(t *testing.T) {
				t.Parallel()
				e := setup(t, kind, acquirer.Options{})
				e.background(t, 4)
				e.settle(t, e.authorize(t), chargeonce.KindCapture, 2000)
				e.settle(t, e.authorize(t), chargeonce.KindCancel, 0)
				charge := e.authorize(t)
				op := tc.inject(t, e, charge)
				e.background(t, 4)
				for _, page := range []int{1, 2, 1000} {
					rep := e.run(t, tc.window, page)
					wantOnly(t, rep, tc.want, charge)
					for _, m := range rep.Mismatches {
						if m.Kind != tc.kind || (tc.kind != chargeonce.LedgerRefund && m.ObjectReference != op) {
							t.Errorf("page %d: mismatch %s of kind %s on %q, want kind %s on %q", page, m.Type, m.Kind, m.ObjectReference, tc.kind, op)
						}
					}
				}
			})
		}
	}
}

// A refund today of an authorization captured (in part) before the read
// began is weighed against what the capture took, not what was
// authorized: neither side shows the capture, so our charge's captured
// amount stands for it.
func TestRefundOfAnEarlierManualCapture(t *testing.T) {
	t.Parallel()
	for _, kind := range kinds {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			e := setup(t, kind, acquirer.Options{})
			charge := e.authorize(t)
			e.settle(t, charge, chargeonce.KindCapture, 1000)
			time.Sleep(20 * time.Millisecond)
			from := time.Now()
			time.Sleep(5 * time.Millisecond)
			e.refund(t, charge, 1000)
			run := func() *recon.Report {
				rep, err := recon.Run(t.Context(), e.recon, e.sim, recon.Options{
					Acquirer: "sim", Period: "refund-day", From: from, To: from.Add(time.Hour),
				})
				if err != nil {
					t.Fatal(err)
				}
				return rep
			}
			rep := run()
			wantOnly(t, rep, nil)
			if rep.Charges != 0 || rep.Operations != 0 || rep.Refunds != 1 || rep.LedgerEntries != 1 || rep.Matched != 1 {
				t.Errorf("charges=%d operations=%d refunds=%d ledger=%d matched=%d, want 0 0 1 1 1", rep.Charges, rep.Operations, rep.Refunds, rep.LedgerEntries, rep.Matched)
			}
			// 1,000 more back at the acquirer: 2,000 of the 1,000 captured
			// (within the 2,500 authorized).
			e.ledgerRefund(idempotency.NewRefundID(), charge, 1000, "BRL", "succeeded")
			wantOnly(t, run(), map[recon.Type]int{recon.MissingInternal: 1, recon.RefundsExceedCapture: 1}, charge)
		})
	}
}

// A capture counts on the day it settled, not on its authorization's: the
// authorization's day holds the charge (no money moved), the capture's day
// the capture of the captured amount, read with its charge by id.
func TestManualCaptureCountsOnTheDayItSettled(t *testing.T) {
	t.Parallel()
	for _, kind := range kinds {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			e := setup(t, kind, acquirer.Options{})
			charge := e.authorize(t)
			time.Sleep(20 * time.Millisecond)
			split := time.Now()
			time.Sleep(5 * time.Millisecond)
			e.settle(t, charge, chargeonce.KindCapture, 1000)
			for _, tc := range []struct {
				name                              string
				from, to                          time.Time
				charges, operations, ledger, refs int
			}{
				{"the authorization's day", split.Add(-time.Hour), split, 1, 0, 1, 1},
				{"the capture's day", split, split.Add(time.Hour), 0, 1, 1, 1},
			} {
				for _, ordered := range []bool{false, true} {
					rep, err := recon.Run(t.Context(), e.recon, e.sim, recon.Options{
						Acquirer: "sim", Period: tc.name, From: tc.from, To: tc.to, PageSize: 1, TimeOrderedIDs: ordered,
					})
					if err != nil {
						t.Fatal(err)
					}
					wantOnly(t, rep, nil)
					if rep.Charges != tc.charges || rep.Operations != tc.operations || rep.LedgerEntries != tc.ledger || rep.Matched != tc.refs {
						t.Errorf("%s: charges=%d operations=%d ledger=%d matched=%d, want %d %d %d %d", tc.name,
							rep.Charges, rep.Operations, rep.LedgerEntries, rep.Matched, tc.charges, tc.operations, tc.ledger, tc.refs)
					}
				}
			}
		})
	}
}
