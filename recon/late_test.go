package recon_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/postgres"
	"github.com/chargeonce/chargeonce/recon"
	"github.com/chargeonce/chargeonce/sqlite"
)

// runDay reconciles [from, to) with a margin of a second and no settlement
// window: the two days either side of "midnight" in the tests below.
func (e *env) runDay(t *testing.T, from, to time.Time) *recon.Report {
	t.Helper()
	rep, err := recon.Run(t.Context(), e.recon, e.sim, recon.Options{
		Acquirer: "sim", Period: from.Format(time.RFC3339Nano), From: from, To: to, Margin: time.Second, PageSize: 2,
	})
	if err != nil {
		t.Fatalf("recon.Run: %v", err)
	}
	return rep
}

func reportJSON(rep *recon.Report) string {
	var b bytes.Buffer
	_ = rep.WriteJSON(&b)
	return b.String()
}

// An acquirer that settles more than the margin after our record, across
// "midnight": a capture, a refund and a manual capture our records made
// before midnight, the acquirer's after it. Both sides agree, so neither
// day reports a mismatch: the day of our records finds the acquirer's by
// reference past its read window, the day of the acquirer's finds ours.
// Two controls that must still alarm on the acquirer's day: a charge we
// declined that the acquirer captured late (status_mismatch), and a
// charge captured before midnight and captured again after it
// (duplicate_for_intent, found by reading the acquirer's ledger back to
// our charge).
func TestLateSettlementAcrossMidnight(t *testing.T) {
	t.Parallel()
	for _, kind := range kinds {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			e := setup(t, kind, acquirer.Options{})
			e.background(t, 3)
			captured := e.record(t, chargeonce.StatusCaptured, 2500, "BRL")
			refunded := e.charge(t, acquirer.TokenOK)
			refund := e.recordRefund(t, refunded, 1000, chargeonce.RefundSucceeded)
			auth := e.authorize(t)
			op := e.recordOp(t, auth, chargeonce.KindCapture, 2500)
			declined := e.record(t, chargeonce.StatusDeclined, 2500, "BRL")
			twice := e.charge(t, acquirer.TokenOK)

			// Midnight is two seconds after every record; the acquirer's
			// entries two seconds after it, past the margin of a second.
			midnight := time.Now().Add(2 * time.Second)
			late := midnight.Add(2 * time.Second)
			for _, le := range []chargeonce.LedgerEntry{
				{Kind: chargeonce.LedgerCapture, Reference: captured.ID, AmountCents: 2500, Status: string(chargeonce.StatusCaptured)},
				{Kind: chargeonce.LedgerRefund, Reference: refund.ID, ChargeReference: refunded, AmountCents: 1000, Status: string(chargeonce.RefundSucceeded)},
				{Kind: chargeonce.LedgerManualCapture, Reference: op, ChargeReference: auth, AmountCents: 2500, Status: string(chargeonce.OperationSucceeded)},
				{Kind: chargeonce.LedgerCapture, Reference: declined.ID, AmountCents: 2500, Status: string(chargeonce.StatusCaptured)},
				{Kind: chargeonce.LedgerCapture, Reference: twice, AmountCents: 2500, Status: string(chargeonce.StatusCaptured)},
			} {
				le.Merchant, le.Currency, le.CreatedAt = "demo", "BRL", late
				e.sim.LedgerAdd(le)
			}

			before := e.runDay(t, midnight.Add(-24*time.Hour), midnight)
			t.Logf("the day of our records: counts %v matched %d charges %d refunds %d operations %d ledger %d",
				before.Counts, before.Matched, before.Charges, before.Refunds, before.Operations, before.LedgerEntries)
			wantOnly(t, before, nil)
			// 3 + captured + refunded + auth + declined + twice; the
			// authorization's day and its capture's are one here.
			if before.Matched != 8 || before.Charges != 8 || before.Refunds != 1 || before.Operations != 1 {
				t.Errorf("the day of our records: matched %d charges %d refunds %d operations %d, want 8 8 1 1",
					before.Matched, before.Charges, before.Refunds, before.Operations)
			}
			if t.Failed() {
				t.Logf("the day of our records: %s", reportJSON(before))
			}

			after := e.runDay(t, midnight, midnight.Add(24*time.Hour))
			t.Logf("the day of the acquirer's: counts %v matched %d charges %d refunds %d operations %d ledger %d",
				after.Counts, after.Matched, after.Charges, after.Refunds, after.Operations, after.LedgerEntries)
			wantOnly(t, after, map[recon.Type]int{recon.StatusMismatch: 1, recon.DuplicateForIntent: 1}, declined.ID, twice)
			for _, m := range after.Mismatches {
				if m.Type == recon.DuplicateForIntent && (m.Reference != twice || len(m.AcquirerIDs) != 2) {
					t.Errorf("duplicate %+v: want %s with both captures' ids", m, twice)
				}
			}
			if after.Matched != 3 || after.Charges != 0 {
				t.Errorf("the day of the acquirer's: matched %d charges %d, want 3 0 (the three late ones, joined with ours of the day before)", after.Matched, after.Charges)
			}
			if len(after.Notes) != 5 {
				t.Errorf("the day of the acquirer's: %d notes, want one per reference joined across midnight: %+v", len(after.Notes), after.Notes)
			}
			if t.Failed() {
				t.Logf("the day of the acquirer's: %s", reportJSON(after))
			}
		})
	}
}

// editCapturedCents sets a charge's captured_cents in the database, as an
// operator's UPDATE (or a bug) would.
func editCapturedCents(t *testing.T, s chargeonce.Store, id string, cents int64) {
	t.Helper()
	ctx := context.Background()
	var err error
	switch st := s.(type) {
	case *postgres.Store:
		_, err = st.Pool().Exec(ctx, `UPDATE charges SET captured_cents = $1 WHERE id = $2`, cents, id)
	case *sqlite.Store:
		w, _ := st.DBs()
		_, err = w.ExecContext(ctx, `UPDATE charges SET captured_cents = ?1 WHERE id = ?2`, cents, id)
	default:
		t.Fatalf("no SQL for a %T store", s)
	}
	if err != nil {
		t.Fatalf("editing captured_cents of %s: %v", id, err)
	}
}

// A manual charge's captured_cents edited in the database from 500 to 700
// while the acquirer captured 500 (and our capture says 500): the charge
// shows 700 captured, and refunds are bounded by it, so it is an
// amount_mismatch of the manual capture, naming what the charge shows.
func TestEditedCapturedCentsIsAmountMismatch(t *testing.T) {
	t.Parallel()
	for _, kind := range kinds {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			e := setup(t, kind, acquirer.Options{})
			e.background(t, 3)
			id := e.authorize(t)
			e.settle(t, id, chargeonce.KindCapture, 500)
			clean := e.run(t, 0, 1000)
			wantOnly(t, clean, nil)
			editCapturedCents(t, e.store, id, 700)
			c, err := e.store.ChargeGet(t.Context(), "demo", id)
			if err != nil || c.AmountCaptured() != 700 {
				t.Fatalf("the edited charge: %+v %v, want 700 captured", c, err)
			}
			for _, page := range []int{1, 1000} {
				rep := e.run(t, 0, page)
				t.Logf("page %d: counts %v matched %d", page, rep.Counts, rep.Matched)
				wantOnly(t, rep, map[recon.Type]int{recon.AmountMismatch: 1}, id)
				for _, m := range rep.Mismatches {
					if m.Kind != chargeonce.LedgerManualCapture || m.OurAmountCents != 700 || m.AcquirerAmountCents != 500 {
						t.Errorf("page %d: %+v, want the manual capture: 700 shown by us, 500 at the acquirer", page, m)
					}
				}
			}
		})
	}
}
