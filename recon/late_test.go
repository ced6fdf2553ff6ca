package recon_test

import (
	"bytes"
	"context"
	"net/http/httptest"
	"strings"
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
			if len(before.Notes) != 3 {
				t.Errorf("the day of our records: %d notes, want the capture, the refund and the manual capture found past midnight: %+v", len(before.Notes), before.Notes)
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

// editCharge runs an UPDATE of one charge, as an operator's edit (or a
// bug) would: set is the SET clause, $1 (?1) the value, $2 (?2) the id.
func editCharge(t *testing.T, s chargeonce.Store, id, set string, v any) {
	t.Helper()
	ctx := context.Background()
	var err error
	switch st := s.(type) {
	case *postgres.Store:
		_, err = st.Pool().Exec(ctx, `UPDATE charges SET `+set+` WHERE id = $2`, v, id)
	case *sqlite.Store:
		w, _ := st.DBs()
		_, err = w.ExecContext(ctx, `UPDATE charges SET `+strings.ReplaceAll(set, "$1", "?1")+` WHERE id = ?2`, v, id)
	default:
		t.Fatalf("no SQL for a %T store", s)
	}
	if err != nil {
		t.Fatalf("editing %s (%s): %v", id, set, err)
	}
}

// A manual charge's captured_cents edited in the database from 500 to 700
// while the acquirer captured 500 (and our capture says 500): the charge
// shows 700 captured, and refunds are bounded by it, so it is an
// amount_mismatch of the manual capture, naming what the charge shows.
// Its siblings: an automatic charge given a captured_cents (which then
// bounds its refunds instead of its amount), and a captured manual charge
// edited back to authorized (status_mismatch).
func TestEditedCapturedCentsIsAmountMismatch(t *testing.T) {
	t.Parallel()
	for _, kind := range kinds {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			e := setup(t, kind, acquirer.Options{})
			e.background(t, 3)
			manual, auto, reverted := e.authorize(t), e.charge(t, acquirer.TokenOK), e.authorize(t)
			e.settle(t, manual, chargeonce.KindCapture, 500)
			e.settle(t, reverted, chargeonce.KindCapture, 500)
			clean := e.run(t, 0, 1000)
			t.Logf("before the edits: counts %v matched %d", clean.Counts, clean.Matched)
			wantOnly(t, clean, nil)
			editCharge(t, e.store, manual, "captured_cents = $1", 700)
			editCharge(t, e.store, auto, "captured_cents = $1", 2000)
			editCharge(t, e.store, reverted, "status = $1", "authorized")
			c, err := e.store.ChargeGet(t.Context(), "demo", manual)
			if err != nil || c.AmountCaptured() != 700 {
				t.Fatalf("the edited charge: %+v %v, want 700 captured", c, err)
			}
			for _, page := range []int{1, 1000} {
				rep := e.run(t, 0, page)
				t.Logf("page %d: counts %v matched %d", page, rep.Counts, rep.Matched)
				wantOnly(t, rep, map[recon.Type]int{recon.AmountMismatch: 2, recon.StatusMismatch: 1}, manual, auto, reverted)
				for _, m := range rep.Mismatches {
					var ok bool
					switch m.Reference {
					case manual:
						ok = m.Type == recon.AmountMismatch && m.Kind == chargeonce.LedgerManualCapture && m.OurAmountCents == 700 && m.AcquirerAmountCents == 500
					case auto:
						ok = m.Type == recon.AmountMismatch && m.Kind == chargeonce.LedgerCapture && m.OurAmountCents == 2000 && m.AcquirerAmountCents == 2500
					case reverted:
						ok = m.Type == recon.StatusMismatch && m.Kind == chargeonce.LedgerManualCapture
					}
					if !ok {
						t.Errorf("page %d: %+v: not what the edit of %s should report", page, m, m.Reference)
					}
				}
			}
		})
	}
}

// The look-ups past the window go through the acquirer's ledger as any
// reader has it: here over HTTP (GET /v1/ledger), a page of one entry at a
// time.
func TestLateSettlementOverHTTP(t *testing.T) {
	t.Parallel()
	e := setup(t, "sqlite", acquirer.Options{})
	e.background(t, 2)
	c := e.record(t, chargeonce.StatusCaptured, 2500, "BRL")
	midnight := time.Now().Add(2 * time.Second)
	e.sim.LedgerAdd(chargeonce.LedgerEntry{Kind: chargeonce.LedgerCapture, Reference: c.ID, Merchant: "demo", AmountCents: 2500, Currency: "BRL",
		Status: string(chargeonce.StatusCaptured), CreatedAt: midnight.Add(2 * time.Second)})
	srv := httptest.NewServer(acquirer.Handler(e.sim))
	t.Cleanup(srv.Close)
	for _, day := range []struct{ from, to time.Time }{{midnight.Add(-24 * time.Hour), midnight}, {midnight, midnight.Add(24 * time.Hour)}} {
		rep, err := recon.Run(t.Context(), e.recon, acquirer.NewClient(srv.URL, srv.Client()), recon.Options{
			Acquirer: "http", Period: "test", From: day.from, To: day.to, Margin: time.Second, PageSize: 1,
		})
		if err != nil {
			t.Fatal(err)
		}
		wantOnly(t, rep, nil)
		if len(rep.Notes) != 1 || rep.Notes[0].Reference != c.ID {
			t.Errorf("%s: notes %+v, want %s joined across midnight", day.from, rep.Notes, c.ID)
		}
	}
}
