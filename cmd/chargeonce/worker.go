package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/metrics"
	"github.com/chargeonce/chargeonce/queue"
	"github.com/chargeonce/chargeonce/recovery"
	"github.com/chargeonce/chargeonce/replaycache"
)

// DefaultNATS is where worker and publish find NATS by default.
const DefaultNATS = nats.DefaultURL

// workerConfig is everything `worker` is configured with.
type workerConfig struct {
	natsURL, db, logLevel, metricsAddr, durable string
	acq                                         acquirerFlags
	lease, reconcileEvery                       time.Duration
	keyTTL, sweepEvery                          time.Duration
	ackWait, outboxEvery                        time.Duration
	maxDeliver, concurrency, replicas           int
}

func runWorker(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var c workerConfig
	fs := newFlagSet("worker", stderr)
	fs.StringVar(&c.natsURL, "nats", DefaultNATS, "NATS server URL(s), comma-separated")
	fs.StringVar(&c.db, "db", DefaultDB, "database: postgres://… or sqlite:PATH")
	fs.StringVar(&c.logLevel, "log-level", DefaultLogLevel, "debug, info, warn or error")
	fs.StringVar(&c.metricsAddr, "metrics-addr", "", "serve GET /metrics (and /acquirer/ with --acquirer sim) on this address; empty: none")
	fs.StringVar(&c.durable, "durable", queue.DefaultDurable, "name of the durable consumer the workers share")
	c.acq.register(fs)
	fs.DurationVar(&c.lease, "lease", engine.DefaultLease, "how long the attempt that inserted a key owns it before recovery may take over")
	fs.DurationVar(&c.reconcileEvery, "reconcile-every", recovery.DefaultEvery, "how often the recovery loop looks for orphaned charges")
	fs.DurationVar(&c.keyTTL, "key-ttl", engine.DefaultKeyTTL, "how long an idempotency key is remembered")
	fs.DurationVar(&c.sweepEvery, "sweep-every", recovery.DefaultSweepEvery, "how often expired keys are deleted")
	fs.DurationVar(&c.ackWait, "ack-wait", queue.DefaultAckWait, "how long a delivered request may stay unacked before JetStream redelivers it")
	fs.DurationVar(&c.outboxEvery, "outbox-every", queue.DefaultOutboxEvery, "how often the outbox of settled results is drained")
	fs.IntVar(&c.maxDeliver, "max-deliver", queue.DefaultMaxDeliver, "deliveries of one request before it is given up (dead-lettered, or left to the outbox when in flight elsewhere)")
	fs.IntVar(&c.concurrency, "concurrency", queue.DefaultConcurrency, "requests handled at once")
	fs.IntVar(&c.replicas, "replicas", 1, "replicas of the CHARGES and CHARGE_RESULTS streams (3 in a JetStream cluster)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	log, err := newLogger(stderr, c.logLevel)
	if err != nil {
		return err
	}
	for name, d := range map[string]time.Duration{"--lease": c.lease, "--reconcile-every": c.reconcileEvery, "--key-ttl": c.keyTTL,
		"--sweep-every": c.sweepEvery, "--ack-wait": c.ackWait, "--outbox-every": c.outboxEvery} {
		if d <= 0 {
			return fmt.Errorf("%s must be positive; got %s", name, d)
		}
	}
	for name, n := range map[string]int{"--max-deliver": c.maxDeliver, "--concurrency": c.concurrency, "--replicas": c.replicas} {
		if n <= 0 {
			return fmt.Errorf("%s must be positive; got %d", name, n)
		}
	}
	if c.lease <= c.acq.timeout {
		return fmt.Errorf("--lease (%s) must be longer than --acquirer-timeout (%s)", c.lease, c.acq.timeout)
	}
	if c.ackWait <= c.acq.timeout {
		return fmt.Errorf("--ack-wait (%s) must be longer than --acquirer-timeout (%s): otherwise every slow capture is redelivered while it runs", c.ackWait, c.acq.timeout)
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

	nc, err := nats.Connect(c.natsURL,
		nats.Name("chargeonce-worker"),
		nats.MaxReconnects(-1),
		nats.RetryOnFailedConnect(false),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn("disconnected from NATS", "err", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) { log.Info("reconnected to NATS", "url", nc.ConnectedUrlRedacted()) }),
	)
	if err != nil {
		return fmt.Errorf("--nats: connecting to %s: %w", c.natsURL, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("--nats: %w", err)
	}
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err = queue.EnsureStreams(sctx, js, queue.StreamOptions{Replicas: c.replicas})
	cancel()
	if err != nil {
		return fmt.Errorf("--nats: %w", err)
	}

	m := metrics.New()
	qm := m.Queue()
	replays := replaycache.New(store, replaycache.Options{})
	eng := engine.New(replays, acq, engine.Options{
		Lease:           c.lease,
		AcquirerTimeout: c.acq.timeout,
		KeyTTL:          c.keyTTL,
		Logger:          log,
		Observer:        m,
	})
	rescuer := recovery.NewRescuer(store, eng, recovery.RescuerOptions{Every: c.reconcileEvery, Logger: log, OnStuck: m.Stuck, OnFailure: m.RecoveryPassFailed})
	sweeper := recovery.NewSweeper(store, recovery.SweeperOptions{Every: c.sweepEvery, Logger: log})
	publisher := queue.NewPublisher(store, js, queue.PublisherOptions{Every: c.outboxEvery, Logger: log, Observer: qm})
	worker := queue.NewWorker(js, eng, store, queue.WorkerOptions{
		Durable:     c.durable,
		AckWait:     c.ackWait,
		MaxDeliver:  c.maxDeliver,
		Concurrency: c.concurrency,
		Logger:      log,
		Observer:    qm,
	})

	if c.metricsAddr != "" {
		ln, err := net.Listen("tcp", c.metricsAddr)
		if err != nil {
			return fmt.Errorf("--metrics-addr: %w", err)
		}
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", m.Handler())
		if sim != nil {
			mux.Handle("/acquirer/", http.StripPrefix("/acquirer", acquirer.Handler(sim)))
		}
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
		go func() { _ = srv.Serve(ln) }()
		defer srv.Close()
		log.Info("worker metrics listening", "addr", ln.Addr().String())
	}

	rescuer.Start(ctx)
	defer rescuer.Stop()
	sweeper.Start(ctx)
	defer sweeper.Stop()
	publisher.Start(ctx)
	defer publisher.Stop()
	if err := worker.Start(ctx); err != nil {
		return fmt.Errorf("--nats: %w", err)
	}
	log.Info("chargeonce worker consuming", "nats", nc.ConnectedUrlRedacted(), "stream", queue.RequestStream,
		"consumer", c.durable, "db", redactURL(c.db), "acquirer", c.acq.target)
	<-ctx.Done()
	log.Info("shutting down")
	worker.Stop()
	return nil
}
