package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/internal/httpserve"
	"github.com/chargeonce/chargeonce/recovery"
)

func runAcquirer(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var addr, logLevel string
	var slow, latency, window, acceptance time.Duration
	fs := newFlagSet("acquirer", stderr)
	fs.StringVar(&addr, "addr", DefaultAcquirerAddr, "address to listen on")
	fs.DurationVar(&slow, "slow", DefaultSlow, "how long tok_slow takes")
	fs.DurationVar(&latency, "latency", 0, "a delay added to every capture")
	fs.DurationVar(&window, "idempotency-window", 0, "how long a reference is remembered; a repeated capture after that moves money again (0: forever)")
	fs.DurationVar(&acceptance, "acceptance-window", acquirer.DefaultAcceptanceWindow, "how long after it was sent a request may still land; a later one (held by a proxy, a slow token) is refused and moves nothing")
	fs.StringVar(&logLevel, "log-level", DefaultLogLevel, "debug, info, warn or error")
	logFormat := fs.String("log-format", DefaultLogFormat, "text or json")
	maxConns := fs.Int("max-conns", httpserve.DefaultMaxConns, "the most connections kept open; at the cap a new one evicts the longest idle, and is refused (503) when none is idle")
	withTracingHelp(fs, stderr)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *maxConns < 1 {
		return fmt.Errorf("--max-conns must be at least 1; got %d", *maxConns)
	}
	log, err := newLogger(stderr, logLevel, *logFormat)
	if err != nil {
		return err
	}
	opts := acquirer.Options{Latency: latency, Slow: slow, IdempotencyWindow: window, AcceptanceWindow: acceptance}
	if err := opts.Validate(); err != nil {
		return err
	}
	sim := acquirer.NewSimulator(opts)
	tr, stopTracing, err := startTracing(ctx, "acquirer", log)
	if err != nil {
		return err
	}
	defer stopTracing()
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("--addr: %w", err)
	}
	srv := httpserve.New(httpserve.Config{Name: "acquirer", Handler: tr.Handler(tr.Route(acquirer.Handler(sim)), "acquirer"), Logger: log, MaxConns: *maxConns,
		WriteTimeout: slow + latency + handlerSlack})
	log.Info("acquirer simulator listening", "addr", ln.Addr().String(), "slow", slow, "latency", latency, "idempotency_window", window, "acceptance_window", acceptance)
	return serveUntilDone(ctx, srv, ln, log)
}

func runMigrate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var db string
	fs := newFlagSet("migrate", stderr)
	fs.StringVar(&db, "db", DefaultDB, "database: postgres://… or sqlite:PATH")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	store, err := openStore(ctx, db)
	if err != nil {
		return err
	}
	defer store.Close()
	m, ok := store.(interface {
		AppliedMigrations(context.Context) ([]int, error)
	})
	if !ok {
		return fmt.Errorf("--db: this store cannot list its migrations")
	}
	before, err := m.AppliedMigrations(ctx)
	if err != nil {
		return fmt.Errorf("migrating %s: %w", redactURL(db), err)
	}
	if err := store.Migrate(ctx); err != nil {
		return fmt.Errorf("migrating %s: %w", redactURL(db), err)
	}
	after, err := m.AppliedMigrations(ctx)
	if err != nil {
		return fmt.Errorf("migrating %s: %w", redactURL(db), err)
	}
	var applied []string
	for _, v := range after {
		if !slices.Contains(before, v) {
			applied = append(applied, fmt.Sprintf("%04d", v))
		}
	}
	schema := 0
	if len(after) > 0 {
		schema = after[len(after)-1]
	}
	if len(applied) == 0 {
		fmt.Fprintf(stdout, "schema is up to date on %s: version %d, nothing to apply\n", redactURL(db), schema)
		return nil
	}
	fmt.Fprintf(stdout, "applied %s on %s: schema version %d\n", strings.Join(applied, ", "), redactURL(db), schema)
	return nil
}

func runReconcile(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var db, logLevel string
	var lease time.Duration
	var acq acquirerFlags
	fs := newFlagSet("reconcile", stderr)
	fs.StringVar(&db, "db", DefaultDB, "database: postgres://… or sqlite:PATH")
	fs.DurationVar(&lease, "lease", engine.DefaultLease, "the lease recovery takes on each record it claims")
	fs.StringVar(&logLevel, "log-level", DefaultLogLevel, "debug, info, warn or error")
	logFormat := fs.String("log-format", DefaultLogFormat, "text or json")
	acq.registerRemote(fs)
	withTracingHelp(fs, stderr)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	log, err := newLogger(stderr, logLevel, *logFormat)
	if err != nil {
		return err
	}
	if acq.target == "" {
		return fmt.Errorf("--acquirer: reconcile needs the acquirer the charges were sent to: stripe, or the URL of one (such as a `chargeonce acquirer`)")
	}
	if lease <= acq.timeout {
		return fmt.Errorf("--lease (%s) must be longer than --acquirer-timeout (%s)", lease, acq.timeout)
	}
	if acq.target == "sim" {
		// Recovery must re-drive the acquirer the charges were sent to: a
		// simulator made up in this process has never seen them, and
		// settling orphans against it would be settling them against
		// nobody. (serve's own recovery loop shares serve's simulator.)
		return fmt.Errorf("--acquirer: reconcile needs the URL of the acquirer the charges were sent to (such as a `chargeonce acquirer`); an in-process simulator of its own has never seen them")
	}
	tr, stopTracing, err := startTracing(ctx, "reconcile", log)
	if err != nil {
		return err
	}
	defer stopTracing()
	log = tr.Logger(log)
	acq.tracing = tr
	a, _, err := acq.build()
	if err != nil {
		return err
	}
	raw, err := storeFor(ctx, db, postgresTracing(tr)...)
	if err != nil {
		return err
	}
	defer raw.Close()
	store := traceStore(tr, raw)
	eng := engine.New(store, tr.Acquirer(a), engine.Options{Lease: lease, AcquirerTimeout: acq.timeout, Logger: log})
	res, err := recovery.NewRescuer(store, eng, recovery.RescuerOptions{Logger: log}).RunOnce(ctx)
	if err != nil {
		return fmt.Errorf("recovery pass: %w", err)
	}
	fmt.Fprintf(stdout, "claimed=%d settled=%d deferred=%d stuck=%d oldest_stuck_age=%s\n",
		res.Claimed, res.Settled, res.Deferred, res.Stuck.Count, res.Stuck.OldestAge.Round(time.Millisecond))
	return nil
}
