package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/chargeonce/chargeonce/queue"
)

// DefaultNATS is where worker and publish find NATS by default.
const DefaultNATS = nats.DefaultURL

// workerConfig is everything `worker` is configured with.
type workerConfig struct {
	runtimeFlags
	natsURL, metricsAddr, durable     string
	ackWait, outboxEvery              time.Duration
	maxDeliver, concurrency, replicas int
	merchantConcurrency               int
}

func runWorker(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var c workerConfig
	fs := newFlagSet("worker", stderr)
	fs.StringVar(&c.natsURL, "nats", DefaultNATS, "NATS server URL(s), comma-separated")
	fs.StringVar(&c.metricsAddr, "metrics-addr", "", "serve GET /metrics (and /acquirer/ with --acquirer sim, on loopback) on this address; empty: none")
	fs.StringVar(&c.durable, "durable", queue.DefaultDurable, "name of the durable consumer the workers share")
	c.register(fs)
	fs.DurationVar(&c.ackWait, "ack-wait", queue.DefaultAckWait, "how long a delivered request may stay unacked before JetStream redelivers it")
	fs.DurationVar(&c.outboxEvery, "outbox-every", queue.DefaultOutboxEvery, "how often the outbox of settled results is drained")
	fs.IntVar(&c.maxDeliver, "max-deliver", queue.DefaultMaxDeliver, "deliveries of one request before it is given up (its intent's answer published, or the outbox's when in flight elsewhere, or a 503 result and a dead letter); a request waiting out its merchant's rate or an overload is kept, not redelivered, and spends none")
	fs.IntVar(&c.concurrency, "concurrency", queue.DefaultConcurrency, "requests handled at once")
	fs.IntVar(&c.merchantConcurrency, "merchant-concurrency", queue.DefaultMerchantConcurrency, "one merchant's requests handled at once, so one merchant's backlog leaves room for the others; 0: half of --concurrency")
	fs.IntVar(&c.replicas, "replicas", 0, "replicas of the CHARGES and CHARGE_RESULTS streams; 0: 3 on a JetStream cluster of three or more servers, else 1")
	withTracingHelp(fs, stderr)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	log, err := c.logger(stderr)
	if err != nil {
		return err
	}
	for name, d := range map[string]time.Duration{"--ack-wait": c.ackWait, "--outbox-every": c.outboxEvery} {
		if d <= 0 {
			return fmt.Errorf("%s must be positive; got %s", name, d)
		}
	}
	for name, n := range map[string]int{"--max-deliver": c.maxDeliver, "--concurrency": c.concurrency} {
		if n <= 0 {
			return fmt.Errorf("%s must be positive; got %d", name, n)
		}
	}
	if c.merchantConcurrency < 0 || c.merchantConcurrency > c.concurrency {
		return fmt.Errorf("--merchant-concurrency must be between 0 (half of --concurrency) and --concurrency (%d); got %d", c.concurrency, c.merchantConcurrency)
	}
	if c.replicas < 0 {
		return fmt.Errorf("--replicas must be 0 (detect) or positive; got %d", c.replicas)
	}
	if c.ackWait <= c.acq.timeout {
		return fmt.Errorf("--ack-wait (%s) must be longer than --acquirer-timeout (%s): otherwise every slow capture is redelivered while it runs", c.ackWait, c.acq.timeout)
	}
	tr, stopTracing, err := startTracing(ctx, "worker", log)
	if err != nil {
		return err
	}
	defer stopTracing()
	log = tr.Logger(log)
	c.tracing = tr
	rt, err := c.open(ctx, log, nil)
	if err != nil {
		return err
	}
	defer rt.close()

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
	if err == nil {
		err = checkJetStream(ctx, js, c.natsURL)
	}
	if err != nil {
		return fmt.Errorf("--nats: %w", err)
	}
	if c.replicas == 0 {
		c.replicas = queue.DetectReplicas(nc)
	}
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err = queue.EnsureStreams(sctx, js, queue.StreamOptions{Replicas: c.replicas})
	cancel()
	if err != nil {
		return fmt.Errorf("--nats: %w", err)
	}

	qm := rt.metrics.Queue()
	publisher := queue.NewPublisher(rt.store, js, queue.PublisherOptions{Every: c.outboxEvery, Logger: log, Observer: qm})
	worker := queue.NewWorker(js, rt.engine, rt.store, queue.WorkerOptions{
		Durable:             c.durable,
		AckWait:             c.ackWait,
		MaxDeliver:          c.maxDeliver,
		Concurrency:         c.concurrency,
		MerchantConcurrency: c.merchantConcurrency,
		Logger:              log,
		Observer:            qm,
		TracerProvider:      tr.TracerProvider(),
	})
	if c.metricsAddr != "" {
		closeMetrics, err := serveMetrics(ctx, c.metricsAddr, rt, log)
		if err != nil {
			return err
		}
		defer closeMetrics()
	}

	rt.start(ctx)
	defer rt.stop()
	publisher.Start(ctx)
	defer publisher.Stop()
	if err := worker.Start(ctx); err != nil {
		return fmt.Errorf("--nats: %w", err)
	}
	log.Info("chargeonce worker consuming", "nats", nc.ConnectedUrlRedacted(), "stream", queue.RequestStream,
		"consumer", c.durable, "replicas", c.replicas, "db", redactURL(c.db), "acquirer", c.acq.target)
	<-ctx.Done()
	log.Info("shutting down")
	worker.Stop()
	return nil
}

// checkJetStream fails, saying what to do, when the NATS server at url has
// no JetStream: the queue's streams live there. A server answers a JetStream
// request with "not enabled", or, without JetStream at all, not at all.
func checkJetStream(ctx context.Context, js jetstream.JetStream, url string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err := js.AccountInfo(ctx)
	switch {
	case errors.Is(err, jetstream.ErrJetStreamNotEnabled), errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount), errors.Is(err, nats.ErrNoResponders):
		return fmt.Errorf("the NATS server at %s does not have JetStream enabled: start nats-server with -js (or a jetstream {} block in its configuration, with the account's JetStream enabled)", url)
	case err != nil:
		return fmt.Errorf("asking %s for its JetStream account: %w", url, err)
	}
	return nil
}
