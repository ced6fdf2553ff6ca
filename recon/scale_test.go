package recon_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/internal/apitest"
	"github.com/chargeonce/chargeonce/postgres"
	"github.com/chargeonce/chargeonce/recon"
	"github.com/chargeonce/chargeonce/sqlite"
)

// BenchmarkReconcileDay reconciles a day of RECON_BENCH_CHARGES captured
// charges (default 100000; one in ten authorized and then captured, with
// manual capture), spread over yesterday, against a simulator ledger
// holding their captures (and authorizations and captures of them) plus a
// few injected mismatches, on each store. It reports the run's time, charges per second, and the peak Go
// heap in use during the run above what the store and the simulator held
// before it (the ledger itself lives in this process too). Run it with
//
//	go test -run '^$' -bench ReconcileDay -benchtime 1x ./recon/
//
// docs/reconciliation.md quotes its numbers.
func BenchmarkReconcileDay(b *testing.B) {
	n := 100000
	if v := os.Getenv("RECON_BENCH_CHARGES"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 100 {
			b.Fatalf("RECON_BENCH_CHARGES=%q: want a number >= 100", v)
		}
	}
	// RECON_BENCH_OTHER more charges, spread over the four days before,
	// show what reading only the period's ids (TimeOrderedIDs) saves on a
	// table holding more than the day.
	other := 0
	if v := os.Getenv("RECON_BENCH_OTHER"); v != "" {
		var err error
		if other, err = strconv.Atoi(v); err != nil || other < 0 {
			b.Fatalf("RECON_BENCH_OTHER=%q: want a number >= 0", v)
		}
	}
	for _, kind := range kinds {
		b.Run(fmt.Sprintf("%s/%d", kind, n), func(b *testing.B) {
			store := apitest.Store(b, kind)
			sim := apitest.Simulator(b, acquirer.Options{})
			day := time.Now().UTC().Truncate(24*time.Hour).AddDate(0, 0, -1)
			t0 := time.Now()
			charges := fill(b, store, sim, day, n, other)
			b.Logf("%s: stored %d charges and their captures in %s", kind, len(charges), time.Since(t0).Round(time.Millisecond))
			rs := store.(chargeonce.ReconStore)
			b.ResetTimer()
			for i := range 3 * b.N {
				// Every other run measures memory: with the collector
				// running at 5% growth, the heap in use is the live set
				// (plus a little), not the garbage a default GOGC lets
				// pile up above the simulator's ledger; the other run is
				// timed with the default.
				measure, ordered := i%3 == 2, i%3 != 1
				if measure {
					defer debug.SetGCPercent(debug.SetGCPercent(5))
				}
				runtime.GC()
				var base runtime.MemStats
				runtime.ReadMemStats(&base)
				var peak atomic.Uint64
				stop := make(chan struct{})
				done := make(chan struct{})
				go func() {
					defer close(done)
					var ms runtime.MemStats
					for {
						runtime.ReadMemStats(&ms)
						if ms.HeapInuse > peak.Load() {
							peak.Store(ms.HeapInuse)
						}
						select {
						case <-stop:
							return
						case <-time.After(10 * time.Millisecond):
						}
					}
				}()
				// Half way through the ledger, the live heap: after a
				// forced collection, what the run (and the simulator's
				// index) holds, garbage excluded; RECON_BENCH_HEAPPROFILE
				// writes the heap profile of that moment.
				var live uint64
				probe := &probeLedger{Ledger: sim, at: n / chargeonce.ReconDefaultPage / 2, fn: func() {
					runtime.GC()
					var ms runtime.MemStats
					runtime.ReadMemStats(&ms)
					live = ms.HeapAlloc
					if path := os.Getenv("RECON_BENCH_HEAPPROFILE"); path != "" && measure {
						f, err := os.Create(fmt.Sprintf("%s.%s.%d", path, kind, n))
						if err != nil {
							b.Error(err)
							return
						}
						defer f.Close()
						if err := pprof.WriteHeapProfile(f); err != nil {
							b.Error(err)
						}
					}
				}}
				var baseLive runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&baseLive)
				start := time.Now()
				rep, err := recon.Run(context.Background(), rs, probe, recon.Options{
					Acquirer: "sim", Period: day.Format(time.DateOnly), From: day, To: day.AddDate(0, 0, 1), Margin: time.Hour,
					TimeOrderedIDs: ordered,
				})
				elapsed := time.Since(start)
				close(stop)
				<-done
				if err != nil {
					b.Fatal(err)
				}
				if rep.Charges != n || rep.Operations != n/10 || rep.Matched != n-injected || rep.Counts[recon.MissingInternal] != injected || rep.Counts[recon.AmountMismatch] != injected {
					b.Fatalf("charges=%d operations=%d matched=%d counts=%v, want %d charges, %d operations, %d matched, %d missing_internal and %d amount_mismatch",
						rep.Charges, rep.Operations, rep.Matched, rep.Counts, n, n/10, n-injected, injected, injected)
				}
				over := float64(peak.Load()) - float64(base.HeapInuse)
				b.Logf("%s: live heap half way through the run %.1f MB above the %.1f MB live before it", kind,
					(float64(live)-float64(baseLive.HeapAlloc))/(1<<20), float64(baseLive.HeapAlloc)/(1<<20))
				if measure {
					b.ReportMetric((float64(live)-float64(baseLive.HeapAlloc))/(1<<20), "mid-run-live-MB")
					debug.SetGCPercent(100)
					b.ReportMetric(max(over, 0)/(1<<20), "peak-live-heap-MB")
					b.Logf("%s: with GOGC=5, peak heap in use %.1f MB above the %.1f MB held before the run (the store's pool and the simulator's ledger)",
						kind, max(over, 0)/(1<<20), float64(base.HeapInuse)/(1<<20))
					continue
				}
				if ordered {
					b.ReportMetric(elapsed.Seconds(), "run-s")
					b.ReportMetric(float64(n)/elapsed.Seconds(), "charges/s")
				} else {
					b.ReportMetric(elapsed.Seconds(), "all-ids-run-s")
				}
				b.Logf("%s: reconciled %d charges (%d more in the table) in %s (%.0f/s), TimeOrderedIDs=%v; default GOGC: peak heap %.1f MB above the %.1f MB before",
					kind, n, other, elapsed.Round(time.Millisecond), float64(n)/elapsed.Seconds(), ordered, max(over, 0)/(1<<20), float64(base.HeapInuse)/(1<<20))
			}
		})
	}
}

// injected is how many captures the database does not know, and how many
// amount edits, fill adds.
const injected = 5

// fill stores n captured charges created over day, and their captures in
// the simulator's ledger a moment later, the first injected of them for a
// different amount, plus injected captures of references we never stored.
// One charge in ten (manual) is an authorization captured a moment later:
// its charge, its capture in charge_operations, and in the ledger its
// authorization and the capture of it.

func fill(b *testing.B, store chargeonce.Store, sim *acquirer.Simulator, day time.Time, n, other int) []chargeonce.Charge {
	b.Helper()
	step := 24 * time.Hour / time.Duration(n+1)
	charges := make([]chargeonce.Charge, n, n+other)
	var ops []chargeonce.ReconOperation
	for i := range charges {
		at := day.Add(step * time.Duration(i+1)).Truncate(time.Microsecond)
		charges[i] = chargeonce.Charge{ID: benchID(at), MerchantID: "demo", IdempotencyKey: fmt.Sprintf("k%d", i),
			OrderID: int64(i + 1), AmountCents: 2500, Currency: "BRL", PaymentToken: "tok_ok", Status: chargeonce.StatusCaptured, CreatedAt: at}
		if manual(i) {
			charges[i].CaptureMethod, charges[i].CapturedCents = chargeonce.CaptureManual, 2000
			ops = append(ops, chargeonce.ReconOperation{Operation: chargeonce.Operation{
				ID: "cp_" + charges[i].ID[3:], Kind: chargeonce.KindCapture, MerchantID: "demo", IdempotencyKey: fmt.Sprintf("c%d", i),
				ChargeID: charges[i].ID, AmountCents: 2000, Currency: "BRL", Status: chargeonce.OperationSucceeded, CreatedAt: at.Add(10 * time.Millisecond),
			}, SettledAt: at.Add(20 * time.Millisecond)})
		}
	}
	if other > 0 {
		ostep := 4 * 24 * time.Hour / time.Duration(other+1)
		for i := range other {
			at := day.AddDate(0, 0, -4).Add(ostep * time.Duration(i+1)).Truncate(time.Microsecond)
			charges = append(charges, chargeonce.Charge{ID: benchID(at), MerchantID: "demo", IdempotencyKey: fmt.Sprintf("o%d", i),
				OrderID: int64(n + injected + i + 1), AmountCents: 2500, Currency: "BRL", PaymentToken: "tok_ok", Status: chargeonce.StatusCaptured, CreatedAt: at})
		}
	}
	switch s := store.(type) {
	case *postgres.Store:
		_, err := s.Pool().CopyFrom(context.Background(), pgx.Identifier{"charges"},
			[]string{"id", "merchant_id", "idempotency_key", "order_id", "amount_cents", "currency", "payment_token", "status", "created_at", "updated_at", "capture_method", "captured_cents"},
			pgx.CopyFromSlice(len(charges), func(i int) ([]any, error) {
				c := charges[i]
				return []any{c.ID, c.MerchantID, c.IdempotencyKey, c.OrderID, c.AmountCents, c.Currency, c.PaymentToken, string(c.Status), c.CreatedAt, c.CreatedAt,
					nullIf(string(c.CaptureMethod), ""), nullIf(c.CapturedCents, 0)}, nil
			}))
		if err != nil {
			b.Fatalf("copying charges: %v", err)
		}
		_, err = s.Pool().CopyFrom(context.Background(), pgx.Identifier{"charge_operations"},
			[]string{"id", "merchant_id", "idempotency_key", "charge_id", "kind", "amount_cents", "currency", "status", "created_at", "updated_at"},
			pgx.CopyFromSlice(len(ops), func(i int) ([]any, error) {
				o := ops[i]
				return []any{o.ID, o.MerchantID, o.IdempotencyKey, o.ChargeID, string(o.Kind), o.AmountCents, o.Currency, string(o.Status), o.CreatedAt, o.SettledAt}, nil
			}))
		if err != nil {
			b.Fatalf("copying charge_operations: %v", err)
		}
		if _, err := s.Pool().Exec(context.Background(), "ANALYZE charges, charge_operations"); err != nil {
			b.Fatal(err)
		}
	case *sqlite.Store:
		w, _ := s.DBs()
		tx, err := w.Begin()
		if err != nil {
			b.Fatal(err)
		}
		stmt, err := tx.Prepare(`INSERT INTO charges (id, merchant_id, idempotency_key, order_id, amount_cents, currency, payment_token, description, status, created_at, updated_at, capture_method, captured_cents)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, '', ?8, ?9, ?9, ?10, ?11)`)
		if err != nil {
			b.Fatal(err)
		}
		for _, c := range charges {
			if _, err := stmt.Exec(c.ID, c.MerchantID, c.IdempotencyKey, c.OrderID, c.AmountCents, c.Currency, c.PaymentToken, string(c.Status), c.CreatedAt.UnixMicro(),
				nullIf(string(c.CaptureMethod), ""), nullIf(c.CapturedCents, 0)); err != nil {
				b.Fatal(err)
			}
		}
		opStmt, err := tx.Prepare(`INSERT INTO charge_operations (id, merchant_id, idempotency_key, charge_id, kind, amount_cents, currency, status, created_at, updated_at)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)`)
		if err != nil {
			b.Fatal(err)
		}
		for _, o := range ops {
			if _, err := opStmt.Exec(o.ID, o.MerchantID, o.IdempotencyKey, o.ChargeID, string(o.Kind), o.AmountCents, o.Currency, string(o.Status),
				o.CreatedAt.UnixMicro(), o.SettledAt.UnixMicro()); err != nil {
				b.Fatal(err)
			}
		}
		if err := tx.Commit(); err != nil {
			b.Fatal(err)
		}
	default:
		b.Fatalf("no bulk load for %T", store)
	}
	for i, c := range charges[:n] {
		amount := c.AmountCents
		if i < injected {
			amount++
		}
		if manual(i) {
			sim.LedgerAdd(chargeonce.LedgerEntry{Kind: chargeonce.LedgerAuthorization, Reference: c.ID, Merchant: c.MerchantID, OrderID: c.OrderID,
				AmountCents: c.AmountCents, Currency: c.Currency, Status: string(chargeonce.StatusAuthorized), CreatedAt: c.CreatedAt.Add(5 * time.Millisecond)})
			sim.LedgerAdd(chargeonce.LedgerEntry{Kind: chargeonce.LedgerManualCapture, Reference: "cp_" + c.ID[3:], ChargeReference: c.ID, Merchant: c.MerchantID,
				OrderID: c.OrderID, AmountCents: c.CapturedCents, Currency: c.Currency, Status: string(chargeonce.OperationSucceeded), CreatedAt: c.CreatedAt.Add(20 * time.Millisecond)})
			continue
		}
		sim.LedgerAdd(chargeonce.LedgerEntry{Kind: chargeonce.LedgerCapture, Reference: c.ID, Merchant: c.MerchantID, OrderID: c.OrderID,
			AmountCents: amount, Currency: c.Currency, Status: string(chargeonce.StatusCaptured), CreatedAt: c.CreatedAt.Add(50 * time.Millisecond)})
	}
	for i := range injected {
		at := day.Add(time.Duration(i+1) * time.Hour)
		sim.LedgerAdd(chargeonce.LedgerEntry{Kind: chargeonce.LedgerCapture, Reference: benchID(at), Merchant: "demo", OrderID: int64(n + i + 1),
			AmountCents: 2500, Currency: "BRL", Status: string(chargeonce.StatusCaptured), CreatedAt: at})
	}
	return charges[:n]
}

// manual reports whether fill makes the charge i one with manual capture:
// one in ten, none of the first injected (whose amounts it edits).
func manual(i int) bool { return i%10 == 9 }

// nullIf is v, or NULL when it is zero.
func nullIf[T comparable](v, zero T) any {
	if v == zero {
		return nil
	}
	return v
}

// benchID is an id as idempotency.NewChargeID makes it, for a charge
// created at t.
func benchID(t time.Time) string {
	var r [8]byte
	_, _ = rand.Read(r[:])
	return fmt.Sprintf("ch_%012x%s", t.UnixMilli(), hex.EncodeToString(r[:]))
}

// probeLedger calls fn once, before the page number at of the ledger.
type probeLedger struct {
	chargeonce.Ledger
	pages, at int
	fn        func()
}

func (p *probeLedger) LedgerList(ctx context.Context, lp chargeonce.LedgerParams) (chargeonce.LedgerPage, error) {
	if p.pages == p.at {
		p.fn()
	}
	p.pages++
	return p.Ledger.LedgerList(ctx, lp)
}
