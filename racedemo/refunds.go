package racedemo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/idempotency"
)

// RefundDesign names a way of keeping refunds within the captured amount.
type RefundDesign string

// The refund designs, by the names the command line shows.
//
//   - ReadThenInsert reads the sum refunded so far with a SELECT and, if
//     the new refund fits, inserts it with a separate INSERT: two refunds
//     that both read before either inserted both fit, and both are paid
//     (the race Hyperswitch had). It lives only here, in its own table
//     (race_naive_refunds). Do not copy it.
//   - RefundInsertFirst is chargeonce's engine and store, unchanged: the
//     refund's insert adds its amount to the charge under the charge's row
//     lock, and the database refuses a sum past the captured amount.
const (
	ReadThenInsert    RefundDesign = "read-then-insert"
	RefundInsertFirst RefundDesign = "insert-first"
)

// RefundDesigns lists the designs in the order a run shows them.
var RefundDesigns = []RefundDesign{ReadThenInsert, RefundInsertFirst}

// Defaults of RefundOptions: the race, 50 concurrent refunds of 60
// on a captured 100.
const (
	DefaultRefunds       = 50
	DefaultRefundCents   = 60
	DefaultCapturedCents = 100
)

// RefundOptions describe one refund race through one design.
type RefundOptions struct {
	// DB is the database, as --db takes it.
	DB     string
	Design RefundDesign
	// Refunds is how many refunds of RefundCents race on one charge that
	// captured CapturedCents, each with its own idempotency key, spread
	// over Instances instances (refund i on instance i mod Instances).
	Refunds                    int
	RefundCents, CapturedCents int64
	Instances, PoolSize        int
	// Latency is the acquirer's delay on every refund.
	Latency time.Duration
	// Barrier forces ReadThenInsert's worst interleaving: every refund
	// reads the sum before any of them inserts. Without it the race is
	// left to the scheduler (and is lost less often).
	Barrier bool
}

func (o *RefundOptions) validate() error {
	switch {
	case o.Refunds < 1 || o.Instances < 1 || o.PoolSize < 1:
		return errors.New("racedemo: refunds, instances and pool size must be at least 1")
	case o.RefundCents < 1 || o.CapturedCents < 1:
		return errors.New("racedemo: the refund and the capture must be at least 1 cent")
	case o.Latency < 0:
		return errors.New("racedemo: durations must not be negative")
	case o.Design != ReadThenInsert && o.Design != RefundInsertFirst:
		return fmt.Errorf("racedemo: unknown refund design %q", o.Design)
	}
	return nil
}

// Label names the run: the design, and the barrier if any.
func (o *RefundOptions) Label() string {
	if o.Barrier && o.Design == ReadThenInsert {
		return string(o.Design) + " (barrier)"
	}
	return string(o.Design)
}

// RefundResult is one refund race through one design.
type RefundResult struct {
	RefundOptions
	Dialect  string
	Merchant string
	// ChargeID is the refunded charge.
	ChargeID string
	// Answers counts what the refunds' clients were told, such as
	// "201 succeeded" or "409 refund-exceeds-captured".
	Answers map[string]int
	// Paid is how many refunds the acquirer paid out, PaidCents how much.
	Paid      int
	PaidCents int64
	// Errors counts refunds that failed without an answer; FirstError is
	// the first.
	Errors     int
	FirstError error
	Elapsed    time.Duration
}

// OverRefundedCents is how much the acquirer paid back beyond the capture.
func (r *RefundResult) OverRefundedCents() int64 { return max(0, r.PaidCents-r.CapturedCents) }

// refundLedger is the acquirer of the refund race: captures go to the
// simulator; every refund it is sent is paid out, after the latency, as a
// card network's credit is. It does not check refunds against the capture
// on purpose: what the race shows is whether the merchant's own database
// keeps them within it. (The simulator, like Stripe, refuses a refund past
// the capture; an acquirer that settles captures and refunds in separate
// systems, or a partial capture it has not heard of yet, does not.)
type refundLedger struct {
	chargeonce.Acquirer
	latency time.Duration

	mu    sync.Mutex
	paid  map[string]chargeonce.RefundCall // by refund reference
	calls atomic.Int64
}

func newRefundLedger(acq chargeonce.Acquirer, latency time.Duration) *refundLedger {
	return &refundLedger{Acquirer: acq, latency: latency, paid: map[string]chargeonce.RefundCall{}}
}

// Refund pays req out once per reference.
func (l *refundLedger) Refund(ctx context.Context, req chargeonce.RefundCall) (chargeonce.RefundResult, error) {
	l.calls.Add(1)
	if err := sleep(ctx, l.latency); err != nil {
		return chargeonce.RefundResult{}, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.paid[req.Reference]; !ok {
		l.paid[req.Reference] = req
	}
	return chargeonce.RefundResult{Reference: req.Reference, Status: chargeonce.RefundSucceeded}, nil
}

// RefundLookup finds a paid reference; any other is safe to send.
func (l *refundLedger) RefundLookup(_ context.Context, req chargeonce.LookupRequest) (chargeonce.LookupResult, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.paid[req.Reference]; ok {
		return chargeonce.LookupResult{Status: chargeonce.LookupFound, Refund: chargeonce.RefundResult{Reference: req.Reference, Status: chargeonce.RefundSucceeded}}, nil
	}
	return chargeonce.LookupResult{Status: chargeonce.LookupSafeToSend, Reason: "not paid"}, nil
}

// paidFor returns how many refunds of the charge reference were paid, and
// how much.
func (l *refundLedger) paidFor(chargeRef string) (n int, cents int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.paid {
		if c.ChargeReference == chargeRef {
			n++
			cents += c.AmountCents
		}
	}
	return n, cents
}

// The naive refund design's table and statements.
const (
	sqlNaiveRefundsTable = `CREATE TABLE IF NOT EXISTS race_naive_refunds (
		id           TEXT PRIMARY KEY,
		merchant_id  TEXT NOT NULL,
		charge_id    TEXT NOT NULL,
		amount_cents BIGINT NOT NULL,
		status       TEXT NOT NULL
	)`
	sqlNaiveRefunded = `SELECT COALESCE(SUM(amount_cents), 0) FROM race_naive_refunds WHERE charge_id = $1 AND status <> 'failed'`
	sqlNaiveRefund   = `INSERT INTO race_naive_refunds (id, merchant_id, charge_id, amount_cents, status) VALUES ($1, $2, $3, $4, $5)`
	sqlNaiveRefundOK = `UPDATE race_naive_refunds SET status = $1 WHERE id = $2`
)

// RunRefunds races o.Refunds refunds on one captured charge through
// o.Design and reports what the clients were told and what the acquirer
// paid out.
func RunRefunds(ctx context.Context, o RefundOptions) (*RefundResult, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	db, err := parseDB(o.DB)
	if err != nil {
		return nil, err
	}
	sim := acquirer.NewSimulator(acquirer.Options{})
	defer sim.Close()
	ledger := newRefundLedger(sim, o.Latency)
	strategy := CheckThenAct
	if o.Design == RefundInsertFirst {
		strategy = InsertFirst
	}
	co := Options{DB: o.DB, Strategy: strategy, Intents: o.Refunds, Attempts: 1, Instances: o.Instances, PoolSize: o.PoolSize}
	timeout := max(acquirerTimeout, 2*o.Latency)
	insts, err := openInstances(ctx, db, co, sim, timeout)
	if err != nil {
		return nil, err
	}
	defer closeInstances(insts)

	res := &RefundResult{RefundOptions: o, Dialect: db.dialect.String(), Merchant: "race-" + randomHex(6), Answers: map[string]int{}}
	if o.Design == RefundInsertFirst {
		for _, in := range insts {
			in.engine = engine.New(in.store, ledger, engine.Options{AcquirerTimeout: timeout})
		}
		res.ChargeID, err = capturedCharge(ctx, insts[0].engine, res.Merchant, o.CapturedCents)
	} else {
		res.ChargeID, err = naiveCharge(ctx, insts[0], res.Merchant, o.CapturedCents)
	}
	if err != nil {
		return nil, err
	}

	answers := make([]string, o.Refunds)
	errs := make([]error, o.Refunds)
	var read sync.WaitGroup // ReadThenInsert's barrier: every refund has read
	read.Add(o.Refunds)
	gate := make(chan struct{})
	var wg sync.WaitGroup
	t0 := time.Now()
	for i := range o.Refunds {
		in := insts[i%len(insts)]
		wg.Go(func() {
			<-gate
			if o.Design == RefundInsertFirst {
				answers[i], errs[i] = refundInsertFirst(ctx, in, res, i)
			} else {
				answers[i], errs[i] = readThenInsert(ctx, in, ledger, res, &read)
			}
		})
	}
	close(gate)
	wg.Wait()
	res.Elapsed = time.Since(t0)
	for i, a := range answers {
		if errs[i] != nil {
			res.Errors++
			if res.FirstError == nil {
				res.FirstError = errs[i]
			}
			continue
		}
		res.Answers[a]++
	}
	res.Paid, res.PaidCents = ledger.paidFor(res.ChargeID)
	return res, ctx.Err()
}

// capturedCharge charges cents through the engine, as a client would, and
// returns the captured charge's id.
func capturedCharge(ctx context.Context, e *engine.Engine, merchant string, cents int64) (string, error) {
	req := chargeonce.ChargeRequest{OrderID: 1, AmountCents: cents, PaymentToken: acquirer.TokenOK}
	if err := req.Normalize(); err != nil {
		return "", err
	}
	resp, err := e.Charge(ctx, merchant, "refund-race-charge", &req)
	if err != nil {
		return "", fmt.Errorf("charging the refunded charge: %w", err)
	}
	var ch struct{ ID, Status string }
	if err := json.Unmarshal(resp.Body, &ch); err != nil || resp.Status != 201 || ch.Status != string(chargeonce.StatusCaptured) {
		return "", fmt.Errorf("charging the refunded charge: %d %s", resp.Status, resp.Body)
	}
	return ch.ID, nil
}

// naiveCharge writes the naive design's captured charge.
func naiveCharge(ctx context.Context, in *instance, merchant string, cents int64) (string, error) {
	if _, err := in.db.ExecContext(ctx, sqlNaiveRefundsTable); err != nil {
		return "", fmt.Errorf("creating the demonstration's refunds table: %w", err)
	}
	id := idempotency.NewChargeID()
	if _, err := in.db.ExecContext(ctx, sqlNaiveInsert, id, merchant, 1, cents, string(chargeonce.StatusCaptured)); err != nil {
		return "", fmt.Errorf("writing the refunded charge: %w", err)
	}
	return id, nil
}

// refundInsertFirst is one refund through chargeonce's engine.
func refundInsertFirst(ctx context.Context, in *instance, res *RefundResult, i int) (string, error) {
	req := chargeonce.RefundRequest{AmountCents: res.RefundCents}
	resp, err := in.engine.Refund(ctx, res.Merchant, res.ChargeID, "refund-"+strconv.Itoa(i), &req)
	if err != nil {
		switch code := chargeonce.ErrorCode(err); code {
		case chargeonce.EREFUNDEXCEEDS, chargeonce.ENOTREFUNDABLE, chargeonce.EINPROGRESS, chargeonce.EKEYREUSED, chargeonce.EINVALID:
			return "4xx " + code, nil
		}
		return "", err
	}
	var rf struct{ Status string }
	if err := json.Unmarshal(resp.Body, &rf); err != nil {
		return "", fmt.Errorf("reading the refund's answer %s: %w", resp.Body, err)
	}
	return strconv.Itoa(resp.Status) + " " + rf.Status, nil
}

// readThenInsert is the naive design: read what was refunded, and if the
// refund fits, insert it, pay it and mark it succeeded. Nothing keeps two
// refunds from reading the same sum. Do not copy this.
func readThenInsert(ctx context.Context, in *instance, ledger *refundLedger, res *RefundResult, read *sync.WaitGroup) (string, error) {
	var refunded int64
	err := in.db.QueryRowContext(ctx, sqlNaiveRefunded, res.ChargeID).Scan(&refunded)
	read.Done()
	if err != nil {
		return "", fmt.Errorf("reading the sum refunded: %w", err)
	}
	if res.Barrier {
		read.Wait()
	}
	if refunded+res.RefundCents > res.CapturedCents {
		return "4xx " + chargeonce.EREFUNDEXCEEDS, nil
	}
	id := idempotency.NewRefundID()
	if _, err := in.db.ExecContext(ctx, sqlNaiveRefund, id, res.Merchant, res.ChargeID, res.RefundCents, string(chargeonce.RefundPending)); err != nil {
		return "", fmt.Errorf("inserting the refund: %w", err)
	}
	r, err := ledger.Refund(ctx, chargeonce.RefundCall{Reference: id, ChargeReference: res.ChargeID, Merchant: res.Merchant,
		AmountCents: res.RefundCents, Currency: chargeonce.DefaultCurrency})
	if err != nil {
		return "", fmt.Errorf("refunding at the acquirer: %w", err)
	}
	if _, err := in.db.ExecContext(ctx, sqlNaiveRefundOK, string(r.Status), id); err != nil {
		return "", fmt.Errorf("storing the refund's status: %w", err)
	}
	return "201 " + string(r.Status), nil
}

// WriteRefundTable writes one row per refund race: refunds raced, what
// their clients were told, what the acquirer paid out, and the excess.
func WriteRefundTable(w io.Writer, results []*RefundResult) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "design\trefunds\tsucceeded\trefused\tpaid out\tcaptured\tover-refunded\terrors\tanswers\t")
	for _, r := range results {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t\n",
			r.Label(), r.Refunds, r.Answers["201 succeeded"], r.refused(), r.PaidCents, r.CapturedCents, r.OverRefundedCents(), r.Errors, r.answerList())
	}
	return tw.Flush()
}

// refused counts the refunds answered with a 4xx.
func (r *RefundResult) refused() int {
	n := 0
	for a, c := range r.Answers {
		if len(a) > 3 && a[:3] == "4xx" {
			n += c
		}
	}
	return n
}

func (r *RefundResult) answerList() string {
	keys := slices.Sorted(maps.Keys(r.Answers))
	s := ""
	for i, k := range keys {
		if i > 0 {
			s += ", "
		}
		s += fmt.Sprintf("%d × %s", r.Answers[k], k)
	}
	return s
}

// WriteRefundFindings says what the refund races show, from the numbers.
func WriteRefundFindings(w io.Writer, results []*RefundResult) {
	for _, r := range results {
		var s string
		switch over := r.OverRefundedCents(); {
		case over > 0:
			s = fmt.Sprintf("%d refunds of %d were paid on a capture of %d: %d paid back beyond what was captured",
				r.Paid, r.RefundCents, r.CapturedCents, over)
		case r.Paid == int(r.CapturedCents/r.RefundCents):
			s = fmt.Sprintf("exactly %d refund of %d was paid; the other %d were refused naming what remained", r.Paid, r.RefundCents, r.refused())
		default:
			s = fmt.Sprintf("%d refunds paid, %d in all, never past the capture of %d", r.Paid, r.PaidCents, r.CapturedCents)
		}
		fmt.Fprintf(w, "  %s: %s.\n", r.Label(), s)
	}
}
