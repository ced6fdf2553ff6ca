package main

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/internal/httpserve"
	"github.com/chargeonce/chargeonce/metrics"
	"github.com/chargeonce/chargeonce/postgres"
	"github.com/chargeonce/chargeonce/recovery"
	"github.com/chargeonce/chargeonce/replaycache"
	"github.com/chargeonce/chargeonce/sqlite"
	"github.com/chargeonce/chargeonce/tracing"
	"github.com/chargeonce/chargeonce/webhook"
)

// runtimeFlags are the flags of the long-running commands, serve and worker:
// the database, the logs, the acquirer, the engine's timing, recovery and the
// sweeper. Both transports run the same engine, so they take the same flags
// with the same defaults and the same checks.
type runtimeFlags struct {
	db, logLevel, logFormat string
	acq                     acquirerFlags
	lease, reconcileEvery   time.Duration
	keyTTL, sweepEvery      time.Duration
	authorizationTTL        time.Duration
	admissionWait           time.Duration
	merchantRate            string
	merchantBurst           int
	perSecond               float64 // merchantRate, parsed by logger
	// tracing, when set (not a flag: OTEL_EXPORTER_OTLP_ENDPOINT), traces
	// the store, the acquirer and the engine's calls to both.
	tracing  *tracing.Tracing
	webhooks webhookFlags
}

// webhookFlags configure the webhook sender every serve and worker runs.
type webhookFlags struct {
	allowPrivate bool
	scale        float64
	every        time.Duration
}

func (f *runtimeFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.db, "db", DefaultDB, "database: postgres://… or sqlite:PATH")
	fs.StringVar(&f.logLevel, "log-level", DefaultLogLevel, "debug, info, warn or error")
	fs.StringVar(&f.logFormat, "log-format", DefaultLogFormat, "text or json")
	f.acq.register(fs)
	fs.DurationVar(&f.lease, "lease", engine.DefaultLease, "how long the attempt that inserted a key owns it before recovery may take over")
	fs.DurationVar(&f.reconcileEvery, "reconcile-every", recovery.DefaultEvery, "how often the recovery loop looks for orphaned charges")
	fs.DurationVar(&f.keyTTL, "key-ttl", engine.DefaultKeyTTL, "how long an idempotency key is remembered after its charge became final; a key reused after that is a new intent")
	fs.DurationVar(&f.sweepEvery, "sweep-every", recovery.DefaultSweepEvery, "how often expired keys are deleted")
	fs.DurationVar(&f.authorizationTTL, "authorization-ttl", chargeonce.DefaultAuthorizationTTL, "how long an authorization (capture_method manual) waits for its capture before the sweeper cancels it at the acquirer")
	fs.DurationVar(&f.admissionWait, "admission-wait", engine.DefaultAdmissionWait, "how long a new charge waits for a free acquirer slot before it is refused with 503 overloaded (429 rate-limited when its merchant holds its share of the slots)")
	fs.StringVar(&f.merchantRate, "merchant-rate", strconv.Itoa(engine.DefaultMerchantRate)+"/s", "charges one merchant may start per second on this instance, as N, N/s, N/m or N/h; the excess is refused with 429 rate-limited (replays, 409s and 422s are still answered). A line 'rate acme 200/s burst 400' in the API keys gives a merchant its own (docs/operations.md, Secrets)")
	fs.IntVar(&f.merchantBurst, "merchant-burst", engine.DefaultMerchantBurst, "how many attempts past --merchant-rate one merchant may start at once (the token bucket's size)")
	fs.BoolVar(&f.webhooks.allowPrivate, "webhooks-allow-private", false, "let webhook endpoints be http:// and reach loopback, private and link-local addresses (local development and tests only: it opens server-side request forgery)")
	fs.Float64Var(&f.webhooks.scale, "webhooks-schedule-scale", 1, "multiply the webhook retry schedule (5s … 24h) and the 3 days after which a failing endpoint is disabled by this factor (tests shrink it)")
	fs.DurationVar(&f.webhooks.every, "webhooks-every", webhook.DefaultEvery, "how often the webhook sender looks for due deliveries when idle")
}

// logger validates the flags and returns the logger they ask for. Bad values
// fail at start, naming the flag.
func (f *runtimeFlags) logger(stderr io.Writer) (*slog.Logger, error) {
	log, err := newLogger(stderr, f.logLevel, f.logFormat)
	if err != nil {
		return nil, err
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"--lease", f.lease}, {"--reconcile-every", f.reconcileEvery}, {"--key-ttl", f.keyTTL},
		{"--sweep-every", f.sweepEvery}, {"--admission-wait", f.admissionWait}, {"--authorization-ttl", f.authorizationTTL},
	} {
		if d.v <= 0 {
			return nil, fmt.Errorf("%s must be positive; got %s", d.name, d.v)
		}
	}
	perSecond, err := engine.ParsePerSecond(f.merchantRate)
	if err != nil {
		return nil, fmt.Errorf("--merchant-rate: %w", err)
	}
	f.perSecond = perSecond
	if f.merchantBurst < 1 {
		return nil, fmt.Errorf("--merchant-burst must be at least 1; got %d", f.merchantBurst)
	}
	if f.lease <= f.acq.timeout {
		return nil, fmt.Errorf("--lease (%s) must be longer than --acquirer-timeout (%s): otherwise recovery could take over a charge whose attempt is still waiting for the acquirer", f.lease, f.acq.timeout)
	}
	return log, nil
}

// runtime is what serve and worker run on: the migrated store, the engine
// behind the replay cache, the metrics, and the recovery loop and key
// sweeper that every instance runs.
type runtime struct {
	store    chargeonce.Store
	raw      chargeonce.Store // store without its spans (operators)
	acquirer chargeonce.Acquirer
	// finality is what the acquirer promises about late requests (SPEC
	// "Finality"), for the operators' resolution.
	finality chargeonce.Finality
	sim      *acquirer.Simulator // the in-process simulator, or nil
	engine   *engine.Engine
	metrics  *metrics.Metrics
	rescuer  *recovery.Rescuer
	sweeper  *recovery.Sweeper
	sender   *webhook.Sender
}

// open builds the runtime the flags describe, with merchantRates (from the
// API keys) overriding --merchant-rate for some merchants. Close it when
// done.
func (f *runtimeFlags) open(ctx context.Context, log *slog.Logger, merchantRates map[string]engine.Rate) (*runtime, error) {
	if f.webhooks.scale <= 0 || f.webhooks.scale > 1 {
		return nil, fmt.Errorf("--webhooks-schedule-scale must be above 0 and at most 1; got %g", f.webhooks.scale)
	}
	if f.webhooks.every <= 0 {
		return nil, fmt.Errorf("--webhooks-every must be positive; got %s", f.webhooks.every)
	}
	f.acq.tracing = f.tracing
	acq, sim, err := f.acq.build()
	if err != nil {
		return nil, err
	}
	// The adapter's finality is taken before the tracing wrapper, which
	// carries captures and lookups only.
	fin := f.acq.finality(acq)
	acq = f.tracing.Acquirer(acq)
	raw, err := storeFor(ctx, f.db, postgresTracing(f.tracing)...)
	if err != nil {
		return nil, err
	}
	// Everything but the pool statistics uses the store through its spans.
	store := traceStore(f.tracing, raw)
	m := metrics.New()
	// Replays are answered from memory after their first read: a completed
	// record never changes until it expires (see package replaycache). Only
	// the engine goes through the cache; the API's reads, recovery's scans
	// and the sweeper use the store itself.
	replays := replaycache.New(store, replaycache.Options{})
	sender := webhook.NewSender(store, webhook.SenderOptions{Every: f.webhooks.every, Scale: f.webhooks.scale,
		AllowPrivate: f.webhooks.allowPrivate, Logger: log, Observer: m.Webhooks()})
	eng := engine.New(replays, acq, engine.Options{
		Lease:           f.lease,
		AcquirerTimeout: f.acq.timeout,
		KeyTTL:          f.keyTTL,
		AdmissionWait:   f.admissionWait,
		MerchantRate:    engine.Rate{PerSecond: f.perSecond, Burst: f.merchantBurst},
		MerchantRates:   merchantRates,
		Logger:          log,
		Observer:        m,
		// The cache keeps no history; the store does (both stores).
		History: historyOf(raw),
		// A settlement of a merchant the sender delivers to brings its
		// next look forward (webhook.Sender.Nudge).
		Settled: sender.Nudge,
	})
	m.Pool(poolStats(raw))
	return &runtime{
		store:    store,
		raw:      raw,
		acquirer: acq,
		finality: fin,
		sim:      sim,
		engine:   eng,
		metrics:  m,
		rescuer:  recovery.NewRescuer(store, eng, recovery.RescuerOptions{Every: f.reconcileEvery, Logger: log, OnPass: m.RecoveryPass, OnFailure: m.RecoveryPassFailed}),
		sweeper: recovery.NewSweeper(store, recovery.SweeperOptions{Every: f.sweepEvery, Logger: log, OnSweep: m.Swept,
			OnExpire: m.Expired, Canceler: eng, AuthorizationTTL: f.authorizationTTL}),
		sender: sender,
	}, nil
}

// historyOf is where the engine appends charges' history: the store itself,
// not the replay cache in front of it.
func historyOf(store chargeonce.Store) chargeonce.HistoryAppender {
	h, _ := store.(chargeonce.HistoryAppender)
	return h
}

// poolStats reads the connection pool of store for the metrics: pgx's pool
// on PostgreSQL, database/sql's pools (the one writer and the readers) on
// SQLite.
func poolStats(store chargeonce.Store) func() metrics.PoolStats {
	switch s := store.(type) {
	case *postgres.Store:
		return func() metrics.PoolStats {
			st := s.Pool().Stat()
			return metrics.PoolStats{
				Acquired: int(st.AcquiredConns()), Idle: int(st.IdleConns()), Total: int(st.TotalConns()), Max: int(st.MaxConns()),
				Waits: st.EmptyAcquireCount(), WaitTime: st.EmptyAcquireWaitTime(),
			}
		}
	case *sqlite.Store:
		return func() metrics.PoolStats {
			var out metrics.PoolStats
			w, r := s.DBs()
			for _, db := range []*sql.DB{w, r} {
				st := db.Stats()
				out.Acquired += st.InUse
				out.Idle += st.Idle
				out.Total += st.OpenConnections
				out.Max += st.MaxOpenConnections
				out.Waits += st.WaitCount
				out.WaitTime += st.WaitDuration
			}
			return out
		}
	default:
		return func() metrics.PoolStats { return metrics.PoolStats{} }
	}
}

// start runs recovery, the sweeper and the webhook sender in the background
// until stop.
func (r *runtime) start(ctx context.Context) {
	r.rescuer.Start(ctx)
	r.sweeper.Start(ctx)
	r.sender.Start(ctx)
}

// stop ends recovery, the sweeper and the webhook sender, waiting for their
// work in flight.
func (r *runtime) stop() {
	r.sender.Stop()
	r.sweeper.Stop()
	r.rescuer.Stop()
}

// close releases the store.
func (r *runtime) close() { r.store.Close() }

// operators is the store itself, under the spans of r.store: the operators'
// calls (and the charges' history) go to the store untraced, as the traced
// wrapper would send them anyway.
func (r *runtime) operators() chargeonce.Store { return r.raw }

// metricsMaxConns caps the connections of --metrics-addr: scrapers and an
// operator's curl, not clients.
const metricsMaxConns = 256

// serveMetrics serves GET /metrics (and, with the in-process simulator and a
// loopback addr, its API under /acquirer/) on a listener of its own at addr.
// It returns the function that closes it.
func serveMetrics(ctx context.Context, addr string, rt *runtime, log *slog.Logger) (closeFn func(), err error) {
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--metrics-addr: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", rt.metrics.Handler())
	srv := httpserve.New(httpserve.Config{Name: "metrics", Handler: withSimulator(mux, rt.sim, addr), Logger: log, MaxConns: metricsMaxConns})
	rt.metrics.Connections("metrics", srv.Stats)
	go func() { _ = srv.Serve(ln) }()
	log.Info("metrics listening", "addr", ln.Addr().String())
	return func() { _ = srv.Close() }, nil
}
