package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/chargeonce/chargeonce/racedemo"
)

// raceFlags are the flags of `chargeonce race`.
type raceFlags struct {
	db         string
	strategies string
	pause      time.Duration
	intents    int
	attempts   int
	instances  int
	latency    time.Duration
	spread     time.Duration
	stagger    time.Duration
	pool       int
	svg        string
	csv        string
	refunds    int
	barrier    bool
}

func (f *raceFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.db, "db", DefaultDB, "database: postgres://… or sqlite:PATH (use a scratch database: the run leaves its rows behind for inspection)")
	fs.StringVar(&f.strategies, "strategy", "all", "comma-separated strategies to run: check-then-act, locked-transaction, insert-first, or all")
	fs.DurationVar(&f.pause, "pause", racedemo.DefaultPause, "check-then-act runs a second time with this sleep between its check and its insert; 0 leaves that run out")
	fs.IntVar(&f.intents, "intents", racedemo.DefaultIntents, "N: how many payment intents")
	fs.IntVar(&f.attempts, "attempts", racedemo.DefaultAttempts, "K: concurrent attempts per intent (at least 2: a race needs two)")
	fs.IntVar(&f.instances, "instances", racedemo.DefaultInstances, "M: instances, each with its own connection pool; the attempts of one intent land on different instances")
	fs.DurationVar(&f.latency, "latency", racedemo.DefaultLatency, "the simulated acquirer's delay on every capture")
	fs.DurationVar(&f.spread, "spread", racedemo.DefaultSpread, "the window over which intents start, evenly")
	fs.DurationVar(&f.stagger, "stagger", racedemo.DefaultStagger, "the gap between the attempts of one intent; 0 starts them all at once")
	fs.IntVar(&f.pool, "pool", racedemo.DefaultPoolSize, "PostgreSQL connections per instance")
	fs.StringVar(&f.svg, "svg", "", "write a timeline of one contended intent per strategy to this SVG `file`")
	fs.StringVar(&f.csv, "csv", "", "write every attempt's timings (ms from the run's start) to this CSV `file`")
	fs.IntVar(&f.refunds, "refunds", racedemo.DefaultRefunds, "the refund race: this many concurrent refunds of 60 on a captured 100, naive read-then-insert against insert-first; 0 leaves it out")
	fs.BoolVar(&f.barrier, "refund-barrier", true, "the naive refund design runs with every refund reading the sum before any inserts (its worst interleaving); false leaves the interleaving to the scheduler")
}

// refundRuns returns the refund races to make, in order: the naive design
// first, then chargeonce's.
func (f *raceFlags) refundRuns() []racedemo.RefundOptions {
	if f.refunds == 0 {
		return nil
	}
	var runs []racedemo.RefundOptions
	for _, d := range racedemo.RefundDesigns {
		runs = append(runs, racedemo.RefundOptions{
			DB: f.db, Design: d, Refunds: f.refunds,
			RefundCents: racedemo.DefaultRefundCents, CapturedCents: racedemo.DefaultCapturedCents,
			Instances: f.instances, PoolSize: f.pool, Latency: f.latency,
			Barrier: f.barrier && d == racedemo.ReadThenInsert,
		})
	}
	return runs
}

// plan validates the flags and returns the runs to make, in order.
func (f *raceFlags) plan() ([]racedemo.Options, error) {
	switch {
	case f.intents < 1:
		return nil, fmt.Errorf("--intents must be at least 1; got %d", f.intents)
	case f.attempts < 2:
		return nil, fmt.Errorf("--attempts must be at least 2 (a race needs two attempts); got %d", f.attempts)
	case f.instances < 1:
		return nil, fmt.Errorf("--instances must be at least 1; got %d", f.instances)
	case f.pool < 1:
		return nil, fmt.Errorf("--pool must be at least 1; got %d", f.pool)
	case f.refunds < 0 || f.refunds > maxRaceAttempts:
		return nil, fmt.Errorf("--refunds must be between 0 and %d; got %d", maxRaceAttempts, f.refunds)
	case f.intents*f.attempts > maxRaceAttempts:
		return nil, fmt.Errorf("--intents x --attempts must be at most %d; got %d", maxRaceAttempts, f.intents*f.attempts)
	case f.latency < 0:
		return nil, fmt.Errorf("--latency must not be negative; got %s", f.latency)
	case f.pause < 0:
		return nil, fmt.Errorf("--pause must not be negative; got %s", f.pause)
	case f.spread < 0:
		return nil, fmt.Errorf("--spread must not be negative; got %s", f.spread)
	case f.stagger < 0:
		return nil, fmt.Errorf("--stagger must not be negative; got %s", f.stagger)
	}
	if !strings.HasPrefix(f.db, "postgres://") && !strings.HasPrefix(f.db, "postgresql://") && !strings.HasPrefix(f.db, "sqlite:") {
		return nil, fmt.Errorf("--db must be postgres://… or sqlite:PATH; got %q", redactURL(f.db))
	}
	want := map[racedemo.Strategy]bool{}
	for _, name := range strings.Split(f.strategies, ",") {
		name = strings.TrimSpace(name)
		if name == "all" {
			for _, s := range racedemo.Strategies {
				want[s] = true
			}
			continue
		}
		s, err := racedemo.ParseStrategy(name)
		if err != nil {
			return nil, fmt.Errorf("--strategy: %w", err)
		}
		want[s] = true
	}
	base := racedemo.Options{
		DB:        f.db,
		Intents:   f.intents,
		Attempts:  f.attempts,
		Instances: f.instances,
		Latency:   f.latency,
		Spread:    f.spread,
		Stagger:   f.stagger,
		PoolSize:  f.pool,
	}
	var runs []racedemo.Options
	for _, s := range racedemo.Strategies {
		if !want[s] {
			continue
		}
		o := base
		o.Strategy = s
		runs = append(runs, o)
		if s == racedemo.CheckThenAct && f.pause > 0 {
			o.Pause = f.pause
			runs = append(runs, o)
		}
	}
	return runs, nil
}

// maxRaceAttempts keeps a run a demonstration rather than a load test.
const maxRaceAttempts = 20000

func runRace(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var f raceFlags
	fs := newFlagSet("race", stderr)
	f.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	runs, err := f.plan()
	if err != nil {
		return err
	}

	dialect := "PostgreSQL"
	if strings.HasPrefix(f.db, "sqlite:") {
		dialect = "SQLite"
	}
	apart, over := "all at once", "all at once"
	if f.stagger > 0 {
		apart = f.stagger.String() + " apart"
	}
	if f.spread > 0 {
		over = "over " + f.spread.String()
	}
	fmt.Fprintf(stdout, "chargeonce race on %s (%s)\n%d intents x %d concurrent attempts (%s) over %d instances, acquirer latency %s, intents starting %s\n\n",
		dialect, redactURL(f.db), f.intents, f.attempts, apart, f.instances, f.latency, over)

	var results []*racedemo.Result
	for _, o := range runs {
		fmt.Fprintf(stderr, "running %s ...\n", o.Label())
		r, err := racedemo.Run(ctx, o)
		if err != nil {
			if errors.Is(err, context.Canceled) {
				return err
			}
			return fmt.Errorf("%s: %w", o.Label(), err)
		}
		fmt.Fprintf(stderr, "  %d attempts answered in %s (opening and warming %d instances took %s)\n",
			len(r.Attempts), racedemo.FormatDuration(r.Elapsed), r.Instances, racedemo.FormatDuration(r.Setup))
		results = append(results, r)
	}

	if err := racedemo.WriteTable(stdout, results); err != nil {
		return err
	}
	fmt.Fprintln(stdout)
	fmt.Fprintln(stdout, "What the runs show:")
	racedemo.WriteFindings(stdout, results)
	if dialect == "SQLite" {
		fmt.Fprint(stdout, sqliteRaceNotes)
	}
	for _, r := range results {
		if r.Strategy == racedemo.CheckThenAct && r.DoubleCharges() > 0 {
			fmt.Fprintf(stdout, "\nThe doubles are in the database too:\n  SELECT order_id, count(*) FROM race_naive_charges WHERE merchant_id = '%s' GROUP BY order_id HAVING count(*) > 1;\n", r.Merchant)
			break
		}
	}

	if refundRuns := f.refundRuns(); len(refundRuns) > 0 {
		var rr []*racedemo.RefundResult
		for _, o := range refundRuns {
			fmt.Fprintf(stderr, "running the refund race through %s ...\n", o.Label())
			r, err := racedemo.RunRefunds(ctx, o)
			if err != nil {
				if errors.Is(err, context.Canceled) {
					return err
				}
				return fmt.Errorf("refund race, %s: %w", o.Label(), err)
			}
			fmt.Fprintf(stderr, "  %d refunds answered in %s\n", r.Refunds, racedemo.FormatDuration(r.Elapsed))
			rr = append(rr, r)
		}
		fmt.Fprintf(stdout, "\nRefund race: %d concurrent refunds of %d on one charge that captured %d, over %d instances, acquirer latency %s\n",
			f.refunds, racedemo.DefaultRefundCents, racedemo.DefaultCapturedCents, f.instances, f.latency)
		fmt.Fprintln(stdout, "(the acquirer pays out every refund it is sent: only the database keeps refunds within the capture)")
		fmt.Fprintln(stdout)
		if err := racedemo.WriteRefundTable(stdout, rr); err != nil {
			return err
		}
		fmt.Fprintln(stdout)
		fmt.Fprintln(stdout, "What the refund races show:")
		racedemo.WriteRefundFindings(stdout, rr)
		for _, r := range rr {
			if r.Design == racedemo.ReadThenInsert && r.OverRefundedCents() > 0 {
				fmt.Fprintf(stdout, "\nThe over-refund is in the database too:\n  SELECT charge_id, sum(amount_cents) FROM race_naive_refunds WHERE merchant_id = '%s' GROUP BY charge_id;\n", r.Merchant)
			}
		}
	}

	if f.svg != "" {
		if err := writeFile(f.svg, func(w io.Writer) error { return racedemo.WriteSVG(w, results) }); err != nil {
			return fmt.Errorf("--svg: %w", err)
		}
		fmt.Fprintf(stdout, "\nwrote the timeline to %s\n", f.svg)
	}
	if f.csv != "" {
		if err := writeFile(f.csv, func(w io.Writer) error { return racedemo.WriteCSV(w, results) }); err != nil {
			return fmt.Errorf("--csv: %w", err)
		}
		fmt.Fprintf(stdout, "wrote every attempt's timings to %s\n", f.csv)
	}
	return nil
}

// sqliteRaceNotes say what SQLite's single writer does to each strategy.
const sqliteRaceNotes = `
On SQLite (one writer at a time for the whole database):
  check-then-act still races: the check and the insert are separate statements, and
    the write lock is taken only for the insert, after the check has seen nothing.
  locked-transaction's BEGIN IMMEDIATE takes that single write lock and holds it across
    the acquirer call, so every attempt of every intent queues behind it: the intents
    run one at a time, and a retry can wait up to intents x latency, not just one call.
  insert-first runs one sqlite.Store per instance on the same file, as separate
    processes would; their writes are short, so taking turns costs milliseconds.
`

func writeFile(path string, write func(io.Writer) error) error {
	f, err := os.Create(path) //nolint:gosec // G304: the operator names the output file (--svg, --csv); writing there is the point
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
