// Package racedemo is the experiment behind `chargeonce race`: it runs the
// same workload (N intents x K concurrent attempts spread over M instances,
// against a simulated acquirer) through several ways of making a charge
// idempotent, records when every attempt checked, inserted, called the
// acquirer and answered, and counts the money the acquirer moved.
//
// Two of the strategies are the naive designs that chargeonce exists to
// avoid. They live only here, in tables of their own (race_naive_charges,
// race_locked_charges), and nothing outside this package can reach them:
//
//   - CheckThenAct looks for the order's charge with a SELECT and inserts one
//     with a separate INSERT, on a table with no unique constraint. Two
//     attempts that both check before either inserts both charge (CWE-367).
//     An optional pause between the check and the insert widens the window
//     the way the article's one-second demonstration does.
//   - LockedTransaction inserts first on a UNIQUE key, but keeps the
//     transaction open across the acquirer call. It charges once, but every
//     retry waits on the row lock for as long as the acquirer takes.
//
// The third, InsertFirst, is chargeonce's own engine, unchanged, over the
// real store: the record is committed before the acquirer is called, so a
// retry gets its 409 at once.
//
// The acquirer is acquirer.Simulator, in-process; its captures are the
// ground truth for "money moved".
package racedemo

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/acquirer"
)

// Strategy names a way of making a charge idempotent.
type Strategy string

// The strategies, by the names the command line uses.
const (
	CheckThenAct      Strategy = "check-then-act"
	LockedTransaction Strategy = "locked-transaction"
	InsertFirst       Strategy = "insert-first"
)

// Strategies lists every strategy in the order a run shows them: from the
// naive design to chargeonce's.
var Strategies = []Strategy{CheckThenAct, LockedTransaction, InsertFirst}

// ParseStrategy returns the strategy called name.
func ParseStrategy(name string) (Strategy, error) {
	for _, s := range Strategies {
		if string(s) == name {
			return s, nil
		}
	}
	return "", fmt.Errorf("unknown strategy %q (want check-then-act, locked-transaction or insert-first)", name)
}

// Defaults of Options, chosen so that a run of every strategy finishes in a
// few seconds, with each strategy's behaviour plain in the numbers.
const (
	DefaultIntents   = 20
	DefaultAttempts  = 3
	DefaultInstances = 3
	// DefaultLatency is the simulated acquirer's delay: long enough next to
	// a database round trip that waiting on it is unmistakable.
	DefaultLatency = 200 * time.Millisecond
	// DefaultPause is the article's demonstration: one second between the
	// check and the insert.
	DefaultPause = time.Second
	// DefaultSpread is the window over which intents start. Spreading them
	// keeps a locked transaction from exhausting the connection pools, so
	// what its retries wait on is the row lock alone.
	DefaultSpread = time.Second
	// DefaultStagger separates the attempts of one intent by a few
	// milliseconds: they overlap (each arrives while the first is still at
	// the acquirer), but the first has usually inserted by the time the
	// next one checks, which is what makes the unpaused check-then-act look
	// safe in casual testing.
	DefaultStagger = 5 * time.Millisecond
	// DefaultPoolSize matches postgres.DefaultMaxConns: each instance gets
	// the pool it would have in production.
	DefaultPoolSize = 10
	// DefaultAmountCents is what every intent charges.
	DefaultAmountCents = 25000
)

// Options describe one run of one strategy.
type Options struct {
	// DB is the database, as --db takes it: postgres://… or sqlite:PATH.
	DB       string
	Strategy Strategy
	// Pause is slept between the check and the insert (CheckThenAct only).
	Pause time.Duration
	// Intents is N, Attempts is K (the concurrent attempts of one intent),
	// Instances is M: attempt j of intent i runs on instance (i+j) mod M,
	// so the attempts of one intent land on different instances.
	Intents, Attempts, Instances int
	// Latency is the simulated acquirer's delay on every capture.
	Latency time.Duration
	// Spread is the window over which the intents start, evenly.
	Spread time.Duration
	// Stagger is how long after the previous one each attempt of an intent
	// starts: attempt j starts j x Stagger after the intent's first. Zero
	// starts them all at once.
	Stagger time.Duration
	// PoolSize is the most connections each instance opens to PostgreSQL.
	// Instances never share a pool.
	PoolSize int
	// Barrier forces the worst interleaving of CheckThenAct without a
	// pause: every attempt of an intent checks before any of them inserts.
	// Tests use it to make the race deterministic.
	Barrier bool
}

func (o *Options) validate() error {
	if o.Pause < 0 || o.Latency < 0 || o.Spread < 0 || o.Stagger < 0 {
		return errors.New("racedemo: durations must not be negative")
	}
	if o.Intents < 1 || o.Attempts < 1 || o.Instances < 1 || o.PoolSize < 1 {
		return errors.New("racedemo: intents, attempts, instances and pool size must be at least 1")
	}
	if o.Pause > 0 && o.Strategy != CheckThenAct {
		return fmt.Errorf("racedemo: a pause between check and insert only applies to %s", CheckThenAct)
	}
	_, err := ParseStrategy(string(o.Strategy))
	return err
}

// Label names the run the way the command line would: the strategy, and
// its pause if any.
func (o *Options) Label() string {
	if o.Pause > 0 {
		return fmt.Sprintf("%s --pause %s", o.Strategy, o.Pause)
	}
	return string(o.Strategy)
}

// Span is a phase of an attempt, as offsets from the run's common start.
type Span struct {
	From, To time.Duration
}

// Valid reports whether the phase happened.
func (s Span) Valid() bool { return s.To > 0 }

// Len is how long the phase took.
func (s Span) Len() time.Duration { return s.To - s.From }

// Attempt is what one attempt did and when, relative to the run's start.
type Attempt struct {
	Intent   int // 0-based
	Index    int // 0-based within the intent
	Instance int // 0-based

	Start time.Duration
	// Check is the SELECT that looks for an existing charge (CheckThenAct).
	Check Span
	// Pause is the sleep (or the barrier) between check and insert.
	Pause Span
	// Insert is the statement that writes the charge; for
	// LockedTransaction it includes BEGIN and any wait on the row lock.
	Insert Span
	// Acquirer is the capture call, when this attempt made one.
	Acquirer Span
	// Response is storing the final answer (for LockedTransaction, that and
	// COMMIT; for a LockedTransaction retry, reading the winner's answer).
	Response Span
	// Tx is how long a LockedTransaction attempt kept its transaction open.
	Tx Span
	// Done is when the attempt had its answer.
	Done time.Duration

	// Answer is what the client would have been told, such as
	// "201 captured" or "409 in progress".
	Answer string
	// Inserted reports whether this attempt's insert wrote the charge.
	Inserted bool
	// Captured reports whether this attempt's capture moved money.
	Captured bool
	// Err is why the attempt failed, if it did.
	Err error

	t0 time.Time // the run's start
}

// Wait is how long the attempt took to get its answer.
func (a *Attempt) Wait() time.Duration { return a.Done - a.Start }

func (a *Attempt) now() time.Duration { return time.Since(a.t0) }

// since returns the span from from until now.
func (a *Attempt) since(from time.Duration) Span { return Span{From: from, To: a.now()} }

func (a *Attempt) fail(err error) {
	a.Err = err
	a.Answer = "error"
	a.Done = a.now()
}

func (a *Attempt) answer(s string) {
	a.Answer = s
	a.Done = a.now()
}

// Result is one run of one strategy.
type Result struct {
	Options
	// Dialect is "PostgreSQL" or "SQLite".
	Dialect string
	// Merchant is the merchant every charge of the run was made for; it is
	// fresh for every run, so rows of earlier runs are never seen.
	Merchant string
	// Attempts holds every attempt, by intent then index.
	Attempts []Attempt
	// Captures is how many times the acquirer moved money.
	Captures int64
	// CaptureRequests is how many capture calls reached the acquirer.
	CaptureRequests int64
	// CapturesPerIntent is the number of captures of each intent.
	CapturesPerIntent []int
	// Elapsed is how long the workload took, from the first attempt's
	// start to the last answer.
	Elapsed time.Duration
	// Setup is how long opening, migrating and warming the instances took.
	Setup time.Duration
}

// DoubleCharges counts the intents charged more than once.
func (r *Result) DoubleCharges() int {
	n := 0
	for _, c := range r.CapturesPerIntent {
		if c > 1 {
			n++
		}
	}
	return n
}

// ContendedIntents counts the intents that more than one attempt carried.
func (r *Result) ContendedIntents() int {
	if r.Options.Attempts < 2 {
		return 0
	}
	return r.Intents
}

// Errors counts the attempts that failed.
func (r *Result) Errors() int {
	n := 0
	for i := range r.Attempts {
		if r.Attempts[i].Err != nil {
			n++
		}
	}
	return n
}

// FirstError returns the first attempt error, or nil.
func (r *Result) FirstError() error {
	for i := range r.Attempts {
		if r.Attempts[i].Err != nil {
			return r.Attempts[i].Err
		}
	}
	return nil
}

// IntentAttempts returns the attempts of intent i.
func (r *Result) IntentAttempts(i int) []Attempt {
	k := r.Options.Attempts
	return r.Attempts[i*k : (i+1)*k]
}

// First returns the index within intent i of the attempt whose insert
// landed first, or -1 when none inserted.
func (r *Result) First(i int) int {
	first := -1
	for j, a := range r.IntentAttempts(i) {
		if a.Inserted && (first < 0 || a.Insert.To < r.IntentAttempts(i)[first].Insert.To) {
			first = j
		}
	}
	return first
}

// RetryWaits returns, sorted, how long every non-first attempt waited for
// its answer: every attempt of an intent but the one whose insert landed
// first, leaving out attempts that failed.
func (r *Result) RetryWaits() []time.Duration {
	var waits []time.Duration
	for i := 0; i < r.Intents; i++ {
		first := r.First(i)
		for j, a := range r.IntentAttempts(i) {
			if j == first || a.Err != nil {
				continue
			}
			waits = append(waits, a.Wait())
		}
	}
	slices.Sort(waits)
	return waits
}

// Percentile returns the nearest-rank p-th percentile (0 < p <= 1) of
// sorted durations, or 0 for none.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted))*p+0.999999) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// Run runs the workload once through o.Strategy and reports what happened.
// It opens o.Instances separate connection pools to o.DB, creates the
// strategy's tables if needed (for InsertFirst, migrates chargeonce's
// schema), and closes everything before it returns.
func Run(ctx context.Context, o Options) (*Result, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	db, err := parseDB(o.DB)
	if err != nil {
		return nil, err
	}
	setupStart := time.Now()
	sim := acquirer.NewSimulator(acquirer.Options{Latency: o.Latency})
	defer sim.Close()
	insts, err := openInstances(ctx, db, o, sim, max(acquirerTimeout, 2*o.Latency))
	if err != nil {
		return nil, err
	}
	defer closeInstances(insts)

	res := &Result{Options: o, Dialect: db.dialect.String(), Merchant: "race-" + randomHex(6), Setup: time.Since(setupStart)}
	res.Attempts = make([]Attempt, o.Intents*o.Attempts)

	intents := make([]*intent, o.Intents)
	for i := range intents {
		req := chargeonce.ChargeRequest{
			OrderID:      int64(i + 1),
			AmountCents:  DefaultAmountCents,
			PaymentToken: acquirer.TokenOK,
		}
		if err := req.Normalize(); err != nil {
			return nil, fmt.Errorf("building intent %d: %w", i+1, err)
		}
		intents[i] = &intent{
			key:     fmt.Sprintf("intent-%d", i+1),
			req:     req,
			gate:    make(chan struct{}),
			checked: make(chan struct{}),
		}
		intents[i].pending.Store(int64(o.Attempts))
	}

	var wg sync.WaitGroup
	t0 := time.Now()
	for i, it := range intents {
		for j := 0; j < o.Attempts; j++ {
			a := &res.Attempts[i*o.Attempts+j]
			*a = Attempt{Intent: i, Index: j, Instance: (i + j) % o.Instances, t0: t0}
			in := insts[a.Instance]
			stagger := time.Duration(j) * o.Stagger
			wg.Go(func() {
				<-it.gate
				if stagger > 0 {
					time.Sleep(stagger)
				}
				a.Start = a.now()
				in.attempt(ctx, res, it, a)
				if a.Done == 0 {
					a.fail(errNoAnswer)
				}
			})
		}
		// The attempts of one intent wait on one gate, so without a
		// stagger they start within microseconds of each other.
		due := time.Duration(0)
		if o.Intents > 1 {
			due = o.Spread * time.Duration(i) / time.Duration(o.Intents)
		}
		wg.Go(func() {
			// On cancellation the gate opens early and the attempts fail
			// at once on the cancelled context.
			_ = sleep(ctx, time.Until(t0.Add(due)))
			close(it.gate)
		})
	}
	wg.Wait()
	sim.Wait()

	for i := range res.Attempts {
		res.Elapsed = max(res.Elapsed, res.Attempts[i].Done)
	}
	st := sim.Stats()
	res.Captures, res.CaptureRequests = st.Captures, st.CaptureRequests
	res.CapturesPerIntent = make([]int, o.Intents)
	for i, it := range intents {
		res.CapturesPerIntent[i] = sim.CapturedCount(res.Merchant, it.req.OrderID)
	}
	if err := ctx.Err(); err != nil {
		return res, err
	}
	return res, nil
}

// acquirerTimeout bounds one capture call, as engine.DefaultAcquirerTimeout
// does in serve; Run raises it to twice the latency when that is longer.
const acquirerTimeout = 2 * time.Second

// intent is one intent of the workload and its attempts' meeting points.
type intent struct {
	key string
	req chargeonce.ChargeRequest
	// gate is closed when the intent's attempts may start.
	gate chan struct{}
	// checked is closed once every attempt has passed its check (Barrier).
	checked chan struct{}
	pending atomic.Int64
}

// arrive marks one attempt past its check; the last one opens checked.
func (it *intent) arrive() {
	if it.pending.Add(-1) == 0 {
		close(it.checked)
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand does not fail on supported platforms
	}
	return hex.EncodeToString(b)
}
