package recon_test

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"regexp"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/idempotency"
	"github.com/chargeonce/chargeonce/recon"
)

var update = flag.Bool("update", false, "rewrite testdata/golden_report.json from this run")

// tick waits for the next millisecond, so that ids made one after another
// (a time prefix, then random digits) sort in the order they were made.
func tick() { time.Sleep(2 * time.Millisecond) }

// A day with every mismatch type on every kind (captures, refunds,
// manual captures and voids, joins by metadata) reconciled on SQLite, past
// the settlement window and within it: the JSON reports, with what differs
// from run to run (ids, order ids, times, ages) numbered in order of first
// appearance, are the golden file's to the byte. It pins the report while
// the comparators and the pager are rewritten.
func TestGoldenReport(t *testing.T) {
	t.Parallel()
	e := setup(t, "sqlite", acquirer.Options{})
	ledgerAdd := func(kind chargeonce.LedgerKind, ref, chargeRef string, amount int64, currency, status string) {
		e.sim.LedgerAdd(chargeonce.LedgerEntry{
			Kind: kind, Reference: ref, ChargeReference: chargeRef,
			Merchant: "demo", AmountCents: amount, Currency: currency, Status: status,
		})
	}
	scenarios := []func(){
		// Captures.
		func() { e.capture(t, idempotency.NewChargeID(), 2500, "BRL") },
		func() { e.record(t, chargeonce.StatusCaptured, 2500, "BRL") },
		func() { e.capture(t, e.record(t, chargeonce.StatusCaptured, 2500, "BRL").ID, 2600, "BRL") },
		func() { e.capture(t, e.record(t, chargeonce.StatusCaptured, 2500, "BRL").ID, 2500, "USD") },
		func() { e.capture(t, e.record(t, chargeonce.StatusDeclined, 2500, "BRL").ID, 2500, "BRL") },
		func() { e.capture(t, e.record(t, chargeonce.StatusProcessing, 2500, "BRL").ID, 2500, "BRL") },
		func() { e.record(t, chargeonce.StatusProcessing, 2500, "BRL") },
		func() {
			ref := e.charge(t, acquirer.TokenOK)
			ledgerAdd(chargeonce.LedgerCapture, ref, ref, 2500, "BRL", string(chargeonce.StatusCaptured))
		},
		func() {
			ref := e.charge(t, acquirer.TokenOK)
			tick()
			ledgerAdd(chargeonce.LedgerRefund, idempotency.NewRefundID(), ref, 1500, "BRL", "succeeded")
			tick()
			ledgerAdd(chargeonce.LedgerRefund, idempotency.NewRefundID(), ref, 1600, "BRL", "succeeded")
		},
		func() { editCharge(t, e.store, e.charge(t, acquirer.TokenOK), "captured_cents = $1", 2000) },
		func() { e.charge(t, acquirer.TokenDeclined) },
		// Refunds.
		func() { e.recordRefund(t, e.charge(t, acquirer.TokenOK), 1000, chargeonce.RefundSucceeded) },
		func() {
			ch := e.charge(t, acquirer.TokenOK)
			tick()
			e.ledgerRefund(idempotency.NewRefundID(), ch, 1000, "BRL", "succeeded")
		},
		func() {
			ch := e.charge(t, acquirer.TokenOK)
			e.ledgerRefund(e.recordRefund(t, ch, 1000, chargeonce.RefundSucceeded).ID, ch, 1200, "BRL", "succeeded")
		},
		func() {
			ch := e.charge(t, acquirer.TokenOK)
			e.ledgerRefund(e.recordRefund(t, ch, 1000, chargeonce.RefundSucceeded).ID, ch, 1000, "USD", "succeeded")
		},
		func() {
			ch := e.charge(t, acquirer.TokenOK)
			e.ledgerRefund(e.recordRefund(t, ch, 1000, chargeonce.RefundFailed).ID, ch, 1000, "BRL", "succeeded")
		},
		func() {
			ch := e.charge(t, acquirer.TokenOK)
			e.ledgerRefund(e.recordRefund(t, ch, 1000, chargeonce.RefundSucceeded).ID, ch, 1000, "BRL", "failed")
		},
		func() {
			ch := e.charge(t, acquirer.TokenOK)
			rf := e.recordRefund(t, ch, 2000, chargeonce.RefundSucceeded)
			e.ledgerRefund(rf.ID, ch, 2000, "BRL", "succeeded")
			e.ledgerRefund(rf.ID, ch, 2000, "BRL", "succeeded")
		},
		func() {
			ch := e.charge(t, acquirer.TokenOK)
			e.ledgerRefund(e.recordRefund(t, ch, 1000, chargeonce.RefundPending).ID, ch, 1000, "BRL", "succeeded")
		},
		func() { e.recordRefund(t, e.charge(t, acquirer.TokenOK), 1000, chargeonce.RefundPending) },
		func() { e.refund(t, e.charge(t, acquirer.TokenOK), 700) },
		// Manual captures and voids.
		func() { e.settle(t, e.authorize(t), chargeonce.KindCapture, 2000) },
		func() { e.settle(t, e.authorize(t), chargeonce.KindCancel, 0) },
		func() { e.authorize(t) },
		func() {
			ch := e.authorize(t)
			e.recordOp(t, ch, chargeonce.KindCancel, 0)
			tick()
			e.settleAtAcquirer(t, chargeonce.LedgerManualCapture, idempotency.NewOperationID(chargeonce.KindCapture), ch, 2500)
		},
		func() {
			ch := e.authorize(t)
			e.recordOp(t, ch, chargeonce.KindCapture, 2500)
			tick()
			e.settleAtAcquirer(t, chargeonce.LedgerVoid, idempotency.NewOperationID(chargeonce.KindCancel), ch, 2500)
		},
		func() {
			ch := e.authorize(t)
			e.settleAtAcquirer(t, chargeonce.LedgerManualCapture, e.recordOp(t, ch, chargeonce.KindCapture, 1000), ch, 1500)
		},
		func() {
			ch := e.authorize(t)
			tick()
			e.settleAtAcquirer(t, chargeonce.LedgerManualCapture, idempotency.NewOperationID(chargeonce.KindCapture), ch, 2500)
		},
		func() { e.recordOp(t, e.authorize(t), chargeonce.KindCancel, 0) },
		func() { e.recordOp(t, e.authorize(t), chargeonce.KindCapture, 2000) },
		func() {
			ch := e.authorize(t)
			e.settleAtAcquirer(t, chargeonce.LedgerManualCapture, e.recordOpAs(t, ch, chargeonce.KindCapture, 2500, chargeonce.OperationPending), ch, 2500)
		},
		func() {
			ch := e.authorize(t)
			e.settleAtAcquirer(t, chargeonce.LedgerVoid, e.recordOpAs(t, ch, chargeonce.KindCancel, 0, chargeonce.OperationPending), ch, 2500)
		},
		func() { e.recordOpAs(t, e.authorize(t), chargeonce.KindCapture, 2500, chargeonce.OperationPending) },
		func() {
			ch := e.authorize(t)
			e.settle(t, ch, chargeonce.KindCapture, 1000)
			rf := e.recordRefund(t, ch, 1000, chargeonce.RefundSucceeded)
			e.ledgerRefund(rf.ID, ch, 1000, "BRL", "succeeded")
			tick()
			e.ledgerRefund(idempotency.NewRefundID(), ch, 500, "BRL", "succeeded")
		},
		func() {
			ch := e.authorize(t)
			e.settle(t, ch, chargeonce.KindCapture, 500)
			editCharge(t, e.store, ch, "captured_cents = $1", 700)
		},
		func() {
			ch := e.authorize(t)
			e.settle(t, ch, chargeonce.KindCapture, 500)
			editCharge(t, e.store, ch, "status = $1", "authorized")
		},
		func() { e.capture(t, e.record(t, chargeonce.StatusCaptured, 2500, "BRL").ID, 2500, "BRL") },
		func() {
			ch := e.authorize(t)
			ledgerAdd(chargeonce.LedgerCapture, ch, ch, 2500, "BRL", string(chargeonce.StatusCaptured))
			ledgerAdd(chargeonce.LedgerCapture, ch, ch, 2500, "BRL", string(chargeonce.StatusCaptured))
		},
		func() {
			ch := e.authorize(t)
			op := e.recordOp(t, ch, chargeonce.KindCapture, 2500)
			ledgerAdd(chargeonce.LedgerManualCapture, op, ch, 2500, "USD", string(chargeonce.OperationSucceeded))
			ledgerAdd(chargeonce.LedgerManualCapture, op, ch, 2500, "USD", string(chargeonce.OperationSucceeded))
		},
		// Settled by the acquirer past the read window: found by the
		// lookahead, named in the notes.
		func() {
			c := e.record(t, chargeonce.StatusCaptured, 2500, "BRL")
			e.sim.LedgerAdd(chargeonce.LedgerEntry{
				Kind: chargeonce.LedgerCapture, Reference: c.ID, ChargeReference: c.ID, Merchant: "demo",
				AmountCents: 2500, Currency: "BRL", Status: string(chargeonce.StatusCaptured), CreatedAt: time.Now().Add(3 * time.Hour),
			})
		},
		// Joined by metadata.
		func() { e.ledgerCapture("", e.record(t, chargeonce.StatusCaptured, 2500, "BRL").ID, 2500) },
		func() {
			c := e.record(t, chargeonce.StatusCaptured, 2500, "BRL")
			e.ledgerCapture("pi_mangled_"+idempotency.NewToken(), c.ID, 2400)
		},
		func() {
			e.ledgerCapture("pi_broken_build_"+idempotency.NewToken(), e.charge(t, acquirer.TokenOK), 2500)
		},
		func() { e.ledgerCapture("pi_stranger_"+idempotency.NewToken(), idempotency.NewChargeID(), 2500) },
	}
	for _, s := range scenarios {
		s()
		tick()
	}

	now := time.Now()
	var got bytes.Buffer
	for _, window := range []time.Duration{0, 2 * time.Hour} {
		var first []byte
		for _, page := range []int{1, 2, 1000} {
			rep, err := recon.Run(t.Context(), e.recon, e.sim, recon.Options{
				Acquirer: "sim", Period: "golden", From: now.Add(-time.Hour), To: now.Add(time.Hour),
				Margin: time.Hour, SettlementWindow: window, PageSize: page, TimeOrderedIDs: page%2 == 0,
				Now: func() time.Time { return now },
			})
			if err != nil {
				t.Fatalf("recon.Run: %v", err)
			}
			var b bytes.Buffer
			if err := rep.WriteJSON(&b); err != nil {
				t.Fatal(err)
			}
			if first == nil {
				first = b.Bytes()
				fmt.Fprintf(&got, "# settlement window %s\n", window)
				got.Write(b.Bytes())
			} else if !bytes.Equal(normalize(b.Bytes()), normalize(first)) {
				t.Errorf("window %s: the report read a page of %d differs from the first:\n%s", window, page, b.Bytes())
			}
		}
	}
	norm := normalize(got.Bytes())
	const path = "testdata/golden_report.json"
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, norm, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to write it)", err)
	}
	if !bytes.Equal(norm, want) {
		_ = os.WriteFile(path+".got", norm, 0o644)
		t.Errorf("the report differs from %s; this run's is in %s.got (diff them)", path, path)
	}
}

var (
	volatileID   = regexp.MustCompile(`\b[A-Za-z]+(_[a-z]+)*_[0-9a-f]{12,}\b`)
	volatileTime = regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z`)
	volatileOrd  = regexp.MustCompile(`"order_id": \d+`)
	volatileAge  = regexp.MustCompile(`(\d+h)?(\d+m)?[\d.]+s ago`)
)

// normalize numbers the ids in order of first appearance and blanks what
// differs from run to run but is no part of the comparison: times, ages,
// order ids.
func normalize(b []byte) []byte {
	ids := map[string]string{}
	b = volatileID.ReplaceAllFunc(b, func(id []byte) []byte {
		n, ok := ids[string(id)]
		if !ok {
			n = fmt.Sprintf("<id%d>", len(ids)+1)
			ids[string(id)] = n
		}
		return []byte(n)
	})
	b = volatileTime.ReplaceAll(b, []byte("<time>"))
	b = volatileOrd.ReplaceAll(b, []byte(`"order_id": <n>`))
	return volatileAge.ReplaceAll(b, []byte("<age> ago"))
}
