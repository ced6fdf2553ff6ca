package recon_test

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/idempotency"
	"github.com/chargeonce/chargeonce/internal/apitest"
	"github.com/chargeonce/chargeonce/recon"
)

var kinds = []string{"postgres", "sqlite"}

// env is a store, the simulator and the engine over them: charges made
// through env.charge are exactly what `serve` would have made.
type env struct {
	store chargeonce.Store
	recon chargeonce.ReconStore
	sim   *acquirer.Simulator
	eng   *engine.Engine
}

func setup(t *testing.T, kind string, opts acquirer.Options) *env {
	t.Helper()
	s := apitest.Store(t, kind)
	rs, ok := s.(chargeonce.ReconStore)
	if !ok {
		t.Fatalf("the %s store does not implement chargeonce.ReconStore", kind)
	}
	sim := apitest.Simulator(t, opts)
	return &env{store: s, recon: rs, sim: sim, eng: engine.New(s, sim, engine.Options{Lease: 5 * time.Second, AcquirerTimeout: 2 * time.Second})}
}

var orderSeq atomic.Int64

func init() { orderSeq.Store(time.Now().UnixNano() % 1e9 * 1000) }

// charge charges one new intent through the engine and returns the charge's
// id (its acquirer reference).
func (e *env) charge(t *testing.T, token string) string {
	t.Helper()
	req := &chargeonce.ChargeRequest{OrderID: orderSeq.Add(1), AmountCents: 2500, PaymentToken: token}
	if err := req.Normalize(); err != nil {
		t.Fatal(err)
	}
	res, err := e.eng.Charge(t.Context(), "demo", fmt.Sprintf("key-%d", req.OrderID), req)
	if err != nil {
		t.Fatalf("charging: %v", err)
	}
	var body struct {
		ID       string `json:"id"`        // a capture's 201
		ChargeID string `json:"charge_id"` // a decline's 402 problem
	}
	if err := json.Unmarshal(res.Body, &body); err != nil || body.ID+body.ChargeID == "" {
		t.Fatalf("charging: %d %s", res.Status, res.Body)
	}
	return body.ID + body.ChargeID
}

// background makes a few ordinary charges, captured and declined, that
// must reconcile as matched around whatever a test injects.
func (e *env) background(t *testing.T, n int) {
	t.Helper()
	for i := range n {
		tok := acquirer.TokenOK
		if i%4 == 3 {
			tok = acquirer.TokenDeclined
		}
		e.charge(t, tok)
	}
}

// record stores a charge the way the engine does, settled as status,
// without calling the acquirer: what a bug (or an edited row) leaves.
func (e *env) record(t *testing.T, status chargeonce.Status, amount int64, currency string) chargeonce.Charge {
	t.Helper()
	c := chargeonce.Charge{
		ID: idempotency.NewChargeID(), MerchantID: "demo", IdempotencyKey: "rec-" + idempotency.NewToken(),
		OrderID: orderSeq.Add(1), AmountCents: amount, Currency: currency, PaymentToken: acquirer.TokenOK,
	}
	token := idempotency.NewToken()
	if _, inserted, err := e.store.KeyInsert(t.Context(), chargeonce.KeyInsertParams{
		Fingerprint: "fp", Token: token, Lease: time.Minute, Charge: c,
	}); err != nil || !inserted {
		t.Fatalf("KeyInsert: inserted=%v err=%v", inserted, err)
	}
	if status != chargeonce.StatusProcessing {
		err := e.store.KeyComplete(t.Context(), chargeonce.KeyCompleteParams{
			MerchantID: c.MerchantID, Key: c.IdempotencyKey, Token: token, ChargeStatus: status,
			ResponseStatus: 201, ResponseBody: []byte(`{}`), TTL: time.Hour,
		})
		if err != nil {
			t.Fatalf("KeyComplete: %v", err)
		}
	}
	c.Status = status
	return c
}

// capture sends a capture straight to the simulator, as a broken build
// (or another system holding our credentials) would.
func (e *env) capture(t *testing.T, ref string, amount int64, currency string) {
	t.Helper()
	res, err := e.sim.Capture(t.Context(), chargeonce.CaptureRequest{
		Reference: ref, OrderID: orderSeq.Add(1), Merchant: "demo", AmountCents: amount, Currency: currency, PaymentToken: acquirer.TokenOK,
	})
	if err != nil || res.Status != chargeonce.StatusCaptured {
		t.Fatalf("capturing %s at the simulator: %+v %v", ref, res, err)
	}
}

func (e *env) run(t *testing.T, window time.Duration, page int) *recon.Report {
	t.Helper()
	now := time.Now()
	rep, err := recon.Run(t.Context(), e.recon, e.sim, recon.Options{
		Acquirer: "sim", Period: "test", From: now.Add(-time.Hour), To: now.Add(time.Hour),
		Margin: time.Hour, SettlementWindow: window, PageSize: page, TimeOrderedIDs: page%2 == 0,
	})
	if err != nil {
		t.Fatalf("recon.Run: %v", err)
	}
	return rep
}

// wantOnly fails unless the report has exactly the counts in want (every
// other type zero) and one mismatch per count, each naming a reference in
// refs.
func wantOnly(t *testing.T, rep *recon.Report, want map[recon.Type]int, refs ...string) {
	t.Helper()
	for _, typ := range recon.Types {
		if rep.Counts[typ] != want[typ] {
			t.Errorf("%s: %d, want %d", typ, rep.Counts[typ], want[typ])
		}
	}
	total := 0
	for _, n := range want {
		total += n
	}
	if len(rep.Mismatches) != total {
		t.Errorf("%d mismatches, want %d: %+v", len(rep.Mismatches), total, rep.Mismatches)
	}
	for _, m := range rep.Mismatches {
		found := false
		for _, r := range refs {
			found = found || m.Reference == r
		}
		if !found {
			t.Errorf("mismatch %s on reference %s, want one of %v", m.Type, m.Reference, refs)
		}
	}
	if t.Failed() {
		var b bytes.Buffer
		_ = rep.WriteJSON(&b)
		t.Logf("report: %s", b.Bytes())
	}
}

func TestCleanDayReportsNothing(t *testing.T) {
	t.Parallel()
	for _, kind := range kinds {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			e := setup(t, kind, acquirer.Options{})
			e.background(t, 24)
			for _, page := range []int{1, 7, 1000} {
				rep := e.run(t, 0, page)
				wantOnly(t, rep, nil)
				if !rep.Clean || rep.Charges != 24 || rep.LedgerEntries != 24 || rep.Matched != 24 {
					t.Errorf("page %d: clean=%v charges=%d ledger=%d matched=%d, want true 24 24 24", page, rep.Clean, rep.Charges, rep.LedgerEntries, rep.Matched)
				}
			}
		})
	}
}

func TestEachMismatchReportedOnce(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		window time.Duration
		opts   acquirer.Options
		inject func(t *testing.T, e *env) string // returns the reference
		want   map[recon.Type]int
	}{
		{
			name: "capture the database does not know",
			inject: func(t *testing.T, e *env) string {
				ref := idempotency.NewChargeID()
				e.capture(t, ref, 2500, "BRL")
				return ref
			},
			want: map[recon.Type]int{recon.MissingInternal: 1},
		},
		{
			name: "captured with us, nothing at the acquirer",
			inject: func(t *testing.T, e *env) string {
				return e.record(t, chargeonce.StatusCaptured, 2500, "BRL").ID
			},
			want: map[recon.Type]int{recon.MissingAtAcquirer: 1},
		},
		{
			name:   "captured with us, nothing at the acquirer yet, within the window",
			window: time.Hour,
			inject: func(t *testing.T, e *env) string {
				return e.record(t, chargeonce.StatusCaptured, 2500, "BRL").ID
			},
			want: map[recon.Type]int{recon.Pending: 1},
		},
		{
			name: "amount edited",
			inject: func(t *testing.T, e *env) string {
				c := e.record(t, chargeonce.StatusCaptured, 2500, "BRL")
				e.capture(t, c.ID, 2600, "BRL")
				return c.ID
			},
			want: map[recon.Type]int{recon.AmountMismatch: 1},
		},
		{
			name: "currency differs",
			inject: func(t *testing.T, e *env) string {
				c := e.record(t, chargeonce.StatusCaptured, 2500, "BRL")
				e.capture(t, c.ID, 2500, "USD")
				return c.ID
			},
			want: map[recon.Type]int{recon.CurrencyMismatch: 1},
		},
		{
			name: "declined with us, captured at the acquirer",
			inject: func(t *testing.T, e *env) string {
				c := e.record(t, chargeonce.StatusDeclined, 2500, "BRL")
				e.capture(t, c.ID, 2500, "BRL")
				return c.ID
			},
			want: map[recon.Type]int{recon.StatusMismatch: 1},
		},
		{
			name: "processing with us past the window, captured at the acquirer",
			inject: func(t *testing.T, e *env) string {
				c := e.record(t, chargeonce.StatusProcessing, 2500, "BRL")
				e.capture(t, c.ID, 2500, "BRL")
				return c.ID
			},
			want: map[recon.Type]int{recon.StatusMismatch: 1},
		},
		{
			name: "duplicate capture after the acquirer's idempotency window",
			opts: acquirer.Options{IdempotencyWindow: 30 * time.Millisecond},
			inject: func(t *testing.T, e *env) string {
				ref := e.charge(t, acquirer.TokenOK)
				c, ok := e.sim.Get(ref)
				if !ok {
					t.Fatalf("the simulator has no capture for %s", ref)
				}
				time.Sleep(60 * time.Millisecond)
				e.capture(t, ref, c.AmountCents, c.Currency) // the window is over: money moves again
				return ref
			},
			want: map[recon.Type]int{recon.DuplicateForIntent: 1},
		},
		{
			name: "refunds exceed the capture",
			inject: func(t *testing.T, e *env) string {
				ref := e.charge(t, acquirer.TokenOK)
				for range 2 {
					e.sim.LedgerAdd(chargeonce.LedgerEntry{
						Kind: chargeonce.LedgerRefund, Reference: "re_" + idempotency.NewToken(), ChargeReference: ref,
						Merchant: "demo", AmountCents: 1500, Currency: "BRL", Status: "succeeded",
					})
				}
				return ref
			},
			// Refunds we do not know, too: each is money back we cannot
			// account for.
			want: map[recon.Type]int{recon.RefundsExceedCapture: 1, recon.MissingInternal: 2},
		},
	}
	for _, kind := range kinds {
		for _, tc := range cases {
			t.Run(kind+"/"+tc.name, func(t *testing.T) {
				t.Parallel()
				e := setup(t, kind, tc.opts)
				e.background(t, 5)
				ref := tc.inject(t, e)
				e.background(t, 5)
				for _, page := range []int{2, 1000} {
					rep := e.run(t, tc.window, page)
					wantOnly(t, rep, tc.want, ref)
					if rep.Clean || rep.Matched != 10 {
						t.Errorf("page %d: clean=%v matched=%d, want false 10", page, rep.Clean, rep.Matched)
					}
				}
			})
		}
	}
}

// A reference of the period, read across the margin: a charge created
// before the period whose capture the acquirer made inside it belongs to
// the period before, and is reported on neither side.
func TestMarginKeepsNeighbourDays(t *testing.T) {
	t.Parallel()
	e := setup(t, "sqlite", acquirer.Options{})
	e.background(t, 3)
	ghost := idempotency.NewChargeID()
	e.capture(t, ghost, 2500, "BRL")
	now := time.Now()
	// The period starts after everything above: nothing is in it.
	rep, err := recon.Run(t.Context(), e.recon, e.sim, recon.Options{
		Acquirer: "sim", Period: "later", From: now.Add(time.Millisecond), To: now.Add(time.Hour), Margin: time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	wantOnly(t, rep, nil)
	if rep.Charges != 0 || rep.LedgerEntries != 0 {
		t.Errorf("charges=%d ledger=%d, want 0 0: the neighbour period's references leaked in", rep.Charges, rep.LedgerEntries)
	}
}

func TestRunOverHTTP(t *testing.T) {
	t.Parallel()
	e := setup(t, "sqlite", acquirer.Options{})
	e.background(t, 9)
	ghost := idempotency.NewChargeID()
	e.capture(t, ghost, 2500, "BRL")
	srv := httptest.NewServer(acquirer.Handler(e.sim))
	t.Cleanup(srv.Close)
	now := time.Now()
	rep, err := recon.Run(t.Context(), e.recon, acquirer.NewClient(srv.URL, srv.Client()), recon.Options{
		Acquirer: "http", Period: "test", From: now.Add(-time.Hour), To: now.Add(time.Hour), PageSize: 2,
	})
	if err != nil {
		t.Fatal(err)
	}
	wantOnly(t, rep, map[recon.Type]int{recon.MissingInternal: 1}, ghost)
	if rep.Matched != 9 {
		t.Errorf("matched %d, want 9", rep.Matched)
	}
}

func TestReportCSVAndSavedRun(t *testing.T) {
	t.Parallel()
	for _, kind := range kinds {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			e := setup(t, kind, acquirer.Options{})
			e.background(t, 3)
			c := e.record(t, chargeonce.StatusCaptured, 2500, "BRL")
			rep := e.run(t, 0, 0)
			var b bytes.Buffer
			if err := rep.WriteCSV(&b); err != nil {
				t.Fatal(err)
			}
			rows, err := csv.NewReader(&b).ReadAll()
			if err != nil {
				t.Fatalf("the CSV report does not parse: %v", err)
			}
			if len(rows) != 2 || rows[1][0] != string(recon.MissingAtAcquirer) || rows[1][1] != c.ID || rows[1][5] != "2500" {
				t.Fatalf("CSV rows %q, want the header and one missing_at_acquirer row for %s", rows, c.ID)
			}

			first, err := recon.Save(t.Context(), e.recon, rep)
			if err != nil {
				t.Fatal(err)
			}
			// The same period again, after the acquirer caught up: one run,
			// updated, never two.
			e.capture(t, c.ID, 2500, "BRL")
			again, err := recon.Save(t.Context(), e.recon, e.run(t, 0, 0))
			if err != nil {
				t.Fatal(err)
			}
			got, err := e.recon.ReconRunGet(t.Context(), "sim", "test")
			if err != nil {
				t.Fatal(err)
			}
			if first.Runs != 1 || again.Runs != 2 || got.Runs != 2 {
				t.Errorf("runs %d, %d, stored %d; want 1, 2, 2", first.Runs, again.Runs, got.Runs)
			}
			if got.Counts[string(recon.MissingAtAcquirer)] != 0 || first.Counts[string(recon.MissingAtAcquirer)] != 1 {
				t.Errorf("stored counts %v (first %v): the re-run did not replace the report", got.Counts, first.Counts)
			}
			var stored recon.Report
			if err := json.Unmarshal(got.Report, &stored); err != nil || !stored.Clean {
				t.Errorf("stored report clean=%v err=%v, want the clean re-run", stored.Clean, err)
			}
		})
	}
}

// A charge created just before the period ends, captured by the acquirer
// just after: with the margin they join; read without one, the capture is
// outside the read window, and the charge is looked up in the acquirer's
// ledger after it (Options.Lookahead) before it is called missing: found,
// joined and noted; with a lookahead too short, missing at the acquirer.
func TestMarginJoinsAcrossMidnight(t *testing.T) {
	t.Parallel()
	for _, kind := range kinds {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			e := setup(t, kind, acquirer.Options{})
			c := e.record(t, chargeonce.StatusCaptured, 2500, "BRL")
			got, err := e.store.ChargeGet(t.Context(), c.MerchantID, c.ID)
			if err != nil {
				t.Fatal(err)
			}
			end := got.CreatedAt.Add(time.Millisecond) // "midnight"
			e.sim.LedgerAdd(chargeonce.LedgerEntry{Kind: chargeonce.LedgerCapture, Reference: c.ID, Merchant: c.MerchantID, OrderID: c.OrderID,
				AmountCents: 2500, Currency: "BRL", Status: string(chargeonce.StatusCaptured), CreatedAt: end.Add(500 * time.Millisecond)})
			for _, tc := range []struct {
				margin, lookahead time.Duration
				want              map[recon.Type]int
				notes             int
			}{
				{time.Hour, 0, nil, 0},
				{0, 0, nil, 1},
				{0, time.Millisecond, map[recon.Type]int{recon.MissingAtAcquirer: 1}, 0},
			} {
				rep, err := recon.Run(t.Context(), e.recon, e.sim, recon.Options{
					Acquirer: "sim", Period: "day", From: end.Add(-24 * time.Hour), To: end, Margin: tc.margin, Lookahead: tc.lookahead,
				})
				if err != nil {
					t.Fatal(err)
				}
				wantOnly(t, rep, tc.want, c.ID)
				if len(rep.Notes) != tc.notes || rep.Matched != 1-len(tc.want) {
					t.Errorf("margin %s lookahead %s: notes %+v matched %d, want %d notes", tc.margin, tc.lookahead, rep.Notes, rep.Matched, tc.notes)
				}
			}
		})
	}
}

// With TimeOrderedIDs our side is read within the period's ids: a charge
// whose id does not begin with its creation time (here, three hours
// before it) is not read, which is the option's stated blind spot; read by
// walking every id, it is found (and missing at the acquirer).
func TestTimeOrderedIDs(t *testing.T) {
	t.Parallel()
	for _, kind := range kinds {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			e := setup(t, kind, acquirer.Options{})
			e.background(t, 4)
			odd := chargeonce.Charge{
				ID: fmt.Sprintf("ch_%012x%s", time.Now().Add(-3*time.Hour).UnixMilli(), "0123456789abcdef"), MerchantID: "demo", IdempotencyKey: "odd",
				OrderID: orderSeq.Add(1), AmountCents: 2500, Currency: "BRL", PaymentToken: acquirer.TokenOK,
			}
			if _, inserted, err := e.store.KeyInsert(t.Context(), chargeonce.KeyInsertParams{Fingerprint: "fp", Token: "t", Lease: time.Minute, Charge: odd}); err != nil || !inserted {
				t.Fatalf("KeyInsert: %v %v", inserted, err)
			}
			now := time.Now()
			for _, ordered := range []bool{true, false} {
				rep, err := recon.Run(t.Context(), e.recon, e.sim, recon.Options{
					Acquirer: "sim", Period: "test", From: now.Add(-time.Hour), To: now.Add(time.Hour), Margin: time.Hour, TimeOrderedIDs: ordered,
				})
				if err != nil {
					t.Fatal(err)
				}
				// The odd charge is processing with nothing at the acquirer
				// past no window: read or not, it is no mismatch; what
				// differs is whether it was read.
				wantOnly(t, rep, nil)
				if want := map[bool]int{true: 4, false: 5}[ordered]; rep.Charges != want {
					t.Errorf("TimeOrderedIDs=%v: %d charges read, want %d", ordered, rep.Charges, want)
				}
			}
		})
	}
}
