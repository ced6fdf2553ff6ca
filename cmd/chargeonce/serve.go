package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/httpapi"
	"github.com/chargeonce/chargeonce/metrics"
	"github.com/chargeonce/chargeonce/recovery"
	"github.com/chargeonce/chargeonce/replaycache"
)

// shutdownTimeout bounds how long serve waits for requests in flight.
const shutdownTimeout = 10 * time.Second

// serveConfig is everything `serve` is configured with.
type serveConfig struct {
	addr, db, apiKeys, logLevel string
	acq                         acquirerFlags
	lease, reconcileEvery       time.Duration
	keyTTL, sweepEvery          time.Duration
}

func runServe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var c serveConfig
	fs := newFlagSet("serve", stderr)
	fs.StringVar(&c.addr, "addr", DefaultAddr, "address to listen on")
	fs.StringVar(&c.db, "db", DefaultDB, "database: postgres://… or sqlite:PATH")
	fs.StringVar(&c.apiKeys, "api-keys", "", "API keys as merchant:secret pairs separated by commas (default: merchant demo, key sk_test_demo, loopback only)")
	fs.StringVar(&c.logLevel, "log-level", DefaultLogLevel, "debug, info, warn or error")
	logFormat := fs.String("log-format", DefaultLogFormat, "text or json")
	c.acq.register(fs)
	fs.DurationVar(&c.lease, "lease", engine.DefaultLease, "how long the attempt that inserted a key owns it before recovery may take over")
	fs.DurationVar(&c.reconcileEvery, "reconcile-every", recovery.DefaultEvery, "how often the recovery loop looks for orphaned charges")
	fs.DurationVar(&c.keyTTL, "key-ttl", engine.DefaultKeyTTL, "how long an idempotency key is remembered; a key reused after that is a new intent")
	fs.DurationVar(&c.sweepEvery, "sweep-every", recovery.DefaultSweepEvery, "how often expired keys are deleted")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	log, err := newLogger(stderr, c.logLevel, *logFormat)
	if err != nil {
		return err
	}
	for name, d := range map[string]time.Duration{"--lease": c.lease, "--reconcile-every": c.reconcileEvery, "--key-ttl": c.keyTTL, "--sweep-every": c.sweepEvery} {
		if d <= 0 {
			return fmt.Errorf("%s must be positive; got %s", name, d)
		}
	}
	if c.lease <= c.acq.timeout {
		return fmt.Errorf("--lease (%s) must be longer than --acquirer-timeout (%s): otherwise recovery could take over a charge whose attempt is still waiting for the acquirer", c.lease, c.acq.timeout)
	}
	keySpec := c.apiKeys
	if keySpec == "" {
		if !isLoopback(c.addr) {
			return fmt.Errorf("--api-keys is required when --addr (%s) is not a loopback address: the demo key is public", c.addr)
		}
		keySpec = httpapi.DemoAPIKeys
		log.Warn("no --api-keys configured: running with the demo merchant \"demo\" and key sk_test_demo (loopback only)")
	}
	keys, err := httpapi.ParseKeys(keySpec)
	if err != nil {
		return fmt.Errorf("--api-keys: %w", err)
	}
	acq, sim, err := c.acq.build()
	if err != nil {
		return err
	}

	store, err := openStore(ctx, c.db)
	if err != nil {
		return err
	}
	defer store.Close()
	if err := store.Migrate(ctx); err != nil {
		return fmt.Errorf("migrating %s: %w", redactURL(c.db), err)
	}

	m := metrics.New()
	// Replays are answered from memory after their first read: a completed
	// record never changes until it expires (see package replaycache). Only
	// the engine goes through the cache; the API's reads, recovery's scans
	// and the sweeper use the store itself.
	replays := replaycache.New(store, replaycache.Options{})
	eng := engine.New(replays, acq, engine.Options{
		Lease:           c.lease,
		AcquirerTimeout: c.acq.timeout,
		KeyTTL:          c.keyTTL,
		Logger:          log,
		Observer:        m,
	})
	api := httpapi.New(httpapi.Config{Engine: eng, Store: store, Keys: keys, Logger: log, Metrics: m.Handler(), Outcomes: m})
	var handler http.Handler = api
	if sim != nil {
		// The in-process simulator's API is mounted under /acquirer so
		// operators and tests can read its captures and stats.
		mux := http.NewServeMux()
		mux.Handle("/acquirer/", http.StripPrefix("/acquirer", acquirer.Handler(sim)))
		mux.Handle("/", api)
		handler = mux
	}

	rescuer := recovery.NewRescuer(store, eng, recovery.RescuerOptions{Every: c.reconcileEvery, Logger: log, OnStuck: m.Stuck})
	sweeper := recovery.NewSweeper(store, recovery.SweeperOptions{Every: c.sweepEvery, Logger: log})

	ln, err := net.Listen("tcp", c.addr)
	if err != nil {
		return fmt.Errorf("--addr: %w", err)
	}
	srv := &http.Server{
		Handler:           httpapi.LogRequests(log, handler),
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		IdleTimeout:       120 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	rescuer.Start(ctx)
	sweeper.Start(ctx)
	defer sweeper.Stop()
	defer rescuer.Stop()

	log.Info("chargeonce listening", "addr", ln.Addr().String(), "db", redactURL(c.db), "acquirer", c.acq.target,
		"lease", c.lease, "key_ttl", c.keyTTL)
	return serveUntilDone(ctx, srv, ln, log)
}

// serveUntilDone serves on ln until ctx ends, then shuts srv down, giving
// requests in flight shutdownTimeout to finish.
func serveUntilDone(ctx context.Context, srv *http.Server, ln net.Listener, log *slog.Logger) error {
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serving: %w", err)
	case <-ctx.Done():
	}
	log.Info("shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("shutting down: %w", err)
	}
	return nil
}

// storeFor is used by commands that only need the database: it opens and
// migrates --db.
func storeFor(ctx context.Context, db string) (chargeonce.Store, error) {
	store, err := openStore(ctx, db)
	if err != nil {
		return nil, err
	}
	if err := store.Migrate(ctx); err != nil {
		store.Close()
		return nil, fmt.Errorf("migrating %s: %w", redactURL(db), err)
	}
	return store, nil
}
