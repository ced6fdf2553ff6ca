package recon_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/idempotency"
	"github.com/chargeonce/chargeonce/recon"
)

// refund refunds amount of charge id through the engine, as POST
// /v1/charges/{id}/refunds would, and returns the refund's id.
func (e *env) refund(t *testing.T, id string, amount int64) string {
	t.Helper()
	res, err := e.eng.Refund(t.Context(), "demo", id, "rk-"+idempotency.NewToken(), &chargeonce.RefundRequest{AmountCents: amount})
	if err != nil {
		t.Fatalf("refunding %s: %v", id, err)
	}
	var body struct {
		ID     string `json:"id"`
		Status string `json:"status"`
	}
	if err := json.Unmarshal(res.Body, &body); err != nil || body.ID == "" || body.Status != string(chargeonce.RefundSucceeded) {
		t.Fatalf("refunding %s: %d %s", id, res.Status, res.Body)
	}
	return body.ID
}

// recordRefund stores a refund of the charge the way the engine does,
// settled as status, without calling the acquirer.
func (e *env) recordRefund(t *testing.T, chargeID string, amount int64, status chargeonce.RefundStatus) chargeonce.Refund {
	t.Helper()
	token := idempotency.NewToken()
	rec, inserted, err := e.store.RefundInsert(t.Context(), chargeonce.RefundInsertParams{
		Fingerprint: "fp", Token: token, Lease: time.Minute,
		Refund: chargeonce.Refund{ID: idempotency.NewRefundID(), MerchantID: "demo", IdempotencyKey: "rrec-" + token, ChargeID: chargeID, AmountCents: amount},
	})
	if err != nil || !inserted {
		t.Fatalf("RefundInsert: inserted=%v err=%v", inserted, err)
	}
	if status != chargeonce.RefundPending {
		if err := e.store.KeyComplete(t.Context(), chargeonce.KeyCompleteParams{
			Kind: chargeonce.KindRefund, MerchantID: rec.MerchantID, Key: rec.Key, Token: token,
			RefundStatus: status, ResponseStatus: 201, ResponseBody: []byte(`{}`), TTL: time.Hour,
		}); err != nil {
			t.Fatalf("KeyComplete: %v", err)
		}
	}
	rf := *rec.Refund
	rf.Status = status
	return rf
}

// ledgerRefund puts a refund in the acquirer's ledger as if it had made it.
func (e *env) ledgerRefund(ref, chargeRef string, amount int64, currency, status string) {
	e.sim.LedgerAdd(chargeonce.LedgerEntry{
		Kind: chargeonce.LedgerRefund, Reference: ref, ChargeReference: chargeRef,
		Merchant: "demo", AmountCents: amount, Currency: currency, Status: status,
	})
}

// Refunds made through the engine reconcile with the simulator's: full,
// partial, two of one charge, and a refused one (the simulator refuses
// nothing here, so all succeed).
func TestRefundsReconcileClean(t *testing.T) {
	t.Parallel()
	for _, kind := range kinds {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			e := setup(t, kind, acquirer.Options{})
			e.background(t, 8)
			a, b := e.charge(t, acquirer.TokenOK), e.charge(t, acquirer.TokenOK)
			e.refund(t, a, 2500)
			e.refund(t, b, 1000)
			e.refund(t, b, 500)
			for _, page := range []int{1, 2, 1000} {
				rep := e.run(t, 0, page)
				wantOnly(t, rep, nil)
				if rep.Refunds != 3 || rep.Charges != 10 || rep.LedgerEntries != 13 || rep.Matched != 10 {
					t.Errorf("page %d: refunds=%d charges=%d ledger=%d matched=%d, want 3 10 13 10", page, rep.Refunds, rep.Charges, rep.LedgerEntries, rep.Matched)
				}
			}
		})
	}
}

// Each refund difference is reported once, on the charge it belongs to,
// naming the refund.
func TestEachRefundMismatchReportedOnce(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		window time.Duration
		inject func(t *testing.T, e *env, charge string) (refund string)
		want   map[recon.Type]int
	}{
		{
			name: "refund missing at the acquirer",
			inject: func(t *testing.T, e *env, charge string) string {
				return e.recordRefund(t, charge, 1000, chargeonce.RefundSucceeded).ID
			},
			want: map[recon.Type]int{recon.MissingAtAcquirer: 1},
		},
		{
			name:   "refund not at the acquirer yet, within the window",
			window: time.Hour,
			inject: func(t *testing.T, e *env, charge string) string {
				return e.recordRefund(t, charge, 1000, chargeonce.RefundSucceeded).ID
			},
			want: map[recon.Type]int{recon.Pending: 1},
		},
		{
			name: "refund the database does not know",
			inject: func(t *testing.T, e *env, charge string) string {
				ref := idempotency.NewRefundID()
				e.ledgerRefund(ref, charge, 1000, "BRL", "succeeded")
				return ref
			},
			want: map[recon.Type]int{recon.MissingInternal: 1},
		},
		{
			name: "refund amount edited",
			inject: func(t *testing.T, e *env, charge string) string {
				rf := e.recordRefund(t, charge, 1000, chargeonce.RefundSucceeded)
				e.ledgerRefund(rf.ID, charge, 1200, "BRL", "succeeded")
				return rf.ID
			},
			want: map[recon.Type]int{recon.AmountMismatch: 1},
		},
		{
			name: "refund currency differs",
			inject: func(t *testing.T, e *env, charge string) string {
				rf := e.recordRefund(t, charge, 1000, chargeonce.RefundSucceeded)
				e.ledgerRefund(rf.ID, charge, 1000, "USD", "succeeded")
				return rf.ID
			},
			want: map[recon.Type]int{recon.CurrencyMismatch: 1},
		},
		{
			name: "refund failed with us, succeeded at the acquirer",
			inject: func(t *testing.T, e *env, charge string) string {
				rf := e.recordRefund(t, charge, 1000, chargeonce.RefundFailed)
				e.ledgerRefund(rf.ID, charge, 1000, "BRL", "succeeded")
				return rf.ID
			},
			want: map[recon.Type]int{recon.StatusMismatch: 1},
		},
		{
			name: "refund succeeded with us, failed at the acquirer",
			inject: func(t *testing.T, e *env, charge string) string {
				rf := e.recordRefund(t, charge, 1000, chargeonce.RefundSucceeded)
				e.ledgerRefund(rf.ID, charge, 1000, "BRL", "failed")
				return rf.ID
			},
			want: map[recon.Type]int{recon.StatusMismatch: 1},
		},
		{
			name: "one refund reference refunded twice",
			inject: func(t *testing.T, e *env, charge string) string {
				rf := e.recordRefund(t, charge, 1000, chargeonce.RefundSucceeded)
				e.ledgerRefund(rf.ID, charge, 1000, "BRL", "succeeded")
				e.ledgerRefund(rf.ID, charge, 1000, "BRL", "succeeded")
				return rf.ID
			},
			want: map[recon.Type]int{recon.DuplicateForIntent: 1},
		},
		{
			name: "refunds exceed the capture at the acquirer",
			inject: func(t *testing.T, e *env, charge string) string {
				rf := e.recordRefund(t, charge, 2000, chargeonce.RefundSucceeded)
				e.ledgerRefund(rf.ID, charge, 2000, "BRL", "succeeded")
				e.ledgerRefund(rf.ID, charge, 2000, "BRL", "succeeded")
				return rf.ID
			},
			want: map[recon.Type]int{recon.DuplicateForIntent: 1, recon.RefundsExceedCapture: 1},
		},
	}
	for _, kind := range kinds {
		for _, tc := range cases {
			t.Run(kind+"/"+tc.name, func(t *testing.T) {
				t.Parallel()
				e := setup(t, kind, acquirer.Options{})
				e.background(t, 4)
				charge := e.charge(t, acquirer.TokenOK)
				refund := tc.inject(t, e, charge)
				e.background(t, 4)
				for _, page := range []int{2, 1000} {
					rep := e.run(t, tc.window, page)
					wantOnly(t, rep, tc.want, charge)
					for _, m := range rep.Mismatches {
						if m.Kind != chargeonce.LedgerRefund || (m.Type != recon.RefundsExceedCapture && m.ObjectReference != refund) {
							t.Errorf("page %d: mismatch %s kind %s object %q, want a refund's naming %s", page, m.Type, m.Kind, m.ObjectReference, refund)
						}
					}
					if rep.Matched != 8 {
						t.Errorf("page %d: matched %d, want 8", page, rep.Matched)
					}
				}
			})
		}
	}
}

// A refund made today of a charge made (and captured) before the read
// began is reconciled today, against the charge's amount: neither side
// shows the capture, and that is no excess. (Seen failing before refunds
// were joined: "refunds_exceed_capture: 1, want 0".)
func TestRefundOfAnEarlierCharge(t *testing.T) {
	t.Parallel()
	for _, kind := range kinds {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			e := setup(t, kind, acquirer.Options{})
			charge := e.charge(t, acquirer.TokenOK)
			time.Sleep(20 * time.Millisecond)
			from := time.Now()
			time.Sleep(5 * time.Millisecond)
			e.refund(t, charge, 1000)
			rep, err := recon.Run(t.Context(), e.recon, e.sim, recon.Options{
				Acquirer: "sim", Period: "refund-day", From: from, To: from.Add(time.Hour),
			})
			if err != nil {
				t.Fatal(err)
			}
			wantOnly(t, rep, nil)
			if rep.Charges != 0 || rep.Refunds != 1 || rep.LedgerEntries != 1 || rep.Matched != 1 {
				t.Errorf("charges=%d refunds=%d ledger=%d matched=%d, want 0 1 1 1", rep.Charges, rep.Refunds, rep.LedgerEntries, rep.Matched)
			}
			// The refund is also over what was captured: reported against
			// the earlier charge's amount.
			e.ledgerRefund(idempotency.NewRefundID(), charge, 2000, "BRL", "succeeded")
			rep, err = recon.Run(t.Context(), e.recon, e.sim, recon.Options{
				Acquirer: "sim", Period: "refund-day", From: from, To: from.Add(time.Hour),
			})
			if err != nil {
				t.Fatal(err)
			}
			wantOnly(t, rep, map[recon.Type]int{recon.MissingInternal: 1, recon.RefundsExceedCapture: 1}, charge)
		})
	}
}

func ExampleMismatch() {
	m := recon.Mismatch{Type: recon.MissingAtAcquirer, Kind: chargeonce.LedgerRefund, Reference: "ch_1", ObjectReference: "re_1"}
	fmt.Println(m.Type, m.Kind, m.Reference, m.ObjectReference)
	// Output: missing_at_acquirer refund ch_1 re_1
}
