package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/httpapi"
	"github.com/chargeonce/chargeonce/internal/httpserve"
	"github.com/chargeonce/chargeonce/postgres"
)

// shutdownTimeout bounds how long serve waits for requests in flight.
const shutdownTimeout = 10 * time.Second

// serveConfig is everything `serve` is configured with.
type serveConfig struct {
	runtimeFlags
	addr, apiKeys, apiKeysFile, metricsAddr string
	adminAddr, adminKeysFile                string
	adminTLSCert, adminTLSKey               string
	adminTrustedProxies                     string
	adminAllowPlainHTTP                     bool
	maxConns                                int
}

func runServe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var c serveConfig
	fs := newFlagSet("serve", stderr)
	fs.StringVar(&c.addr, "addr", DefaultAddr, "address to listen on")
	fs.StringVar(&c.apiKeys, "api-keys", "", "API keys as merchant:secret pairs separated by commas (default: merchant demo, key sk_test_demo, loopback only)")
	fs.StringVar(&c.apiKeysFile, "api-keys-file", "", "a file of API keys, merchant:secret or merchant:sha256:<hex> per line (# comments), so that ps and config repos show no secret, and merchants' own rates (rate acme 200/s burst 400); instead of --api-keys")
	fs.StringVar(&c.metricsAddr, "metrics-addr", "", "serve /metrics on this address of its own (and not on --addr); default: /metrics on --addr")
	fs.IntVar(&c.maxConns, "max-conns", httpserve.DefaultMaxConns, "the most connections --addr keeps open; at the cap a new one evicts the longest idle, and is refused (503) when none is idle. Lowered to fit the file descriptor limit")
	fs.StringVar(&c.adminAddr, "admin-addr", "", "serve the operators' API (/admin/v1/) and web console (/admin/) on this address of its own; off when empty (docs/operators.md)")
	fs.StringVar(&c.adminKeysFile, "admin-keys-file", "", "a file of admin keys, name:sha256:<hex> per line; required when --admin-addr is not a loopback address (default on loopback: admin operator, key ak_test_demo)")
	fs.StringVar(&c.adminTLSCert, "admin-tls-cert", "", "serve --admin-addr over HTTPS with this certificate file (PEM; with --admin-tls-key)")
	fs.StringVar(&c.adminTLSKey, "admin-tls-key", "", "the private key file (PEM) of --admin-tls-cert")
	fs.BoolVar(&c.adminAllowPlainHTTP, "admin-allow-plain-http", false, "serve a non-loopback --admin-addr over plain HTTP, without --admin-tls-cert: only behind a proxy that terminates TLS, or on a network you trust (admin keys and session cookies cross it in clear)")
	fs.StringVar(&c.adminTrustedProxies, "admin-trusted-proxies", "", "addresses or networks (comma-separated, e.g. 10.0.0.5,192.168.0.0/24) of proxies in front of --admin-addr: their X-Forwarded-For names the client and X-Forwarded-Proto: https marks the console as served over HTTPS")
	c.register(fs)
	withTracingHelp(fs, stderr)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if c.maxConns < 1 {
		return fmt.Errorf("--max-conns must be at least 1; got %d", c.maxConns)
	}
	log, err := c.logger(stderr)
	if err != nil {
		return err
	}
	keys, err := c.keys(log)
	if err != nil {
		return err
	}
	if c.acq.target == "sim" && !isLoopback(c.addr) {
		return fmt.Errorf("--acquirer sim (the default) is a demonstration that captures without moving money and serves /acquirer/ without authentication; "+
			"it is refused on a non-loopback --addr (%s): run `chargeonce acquirer` (or a real acquirer) and pass its URL with --acquirer http://HOST:PORT, or listen on --addr 127.0.0.1:PORT", c.addr)
	}
	tr, stopTracing, err := startTracing(ctx, "serve", log)
	if err != nil {
		return err
	}
	defer stopTracing()
	log = tr.Logger(log)
	c.tracing = tr
	rt, err := c.open(ctx, log, keys.Rates())
	if err != nil {
		return err
	}
	defer rt.close()

	apiMetrics := rt.metrics.Handler()
	if c.metricsAddr != "" {
		apiMetrics = nil // served on its own listener only
	}
	api := httpapi.New(httpapi.Config{Engine: rt.engine, Store: rt.store, Keys: keys, Logger: log, Metrics: apiMetrics, Outcomes: rt.metrics, Rejections: rt.metrics,
		WebhooksAllowPrivate: c.webhooks.allowPrivate})
	handler := withSimulator(tr.Route(api), rt.sim, c.addr)

	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", c.addr)
	if err != nil {
		return fmt.Errorf("--addr: %w", err)
	}
	if c.adminAddr != "" {
		closeAdmin, err := c.serveAdmin(ctx, rt, keys, log)
		if err != nil {
			ln.Close()
			return err
		}
		defer closeAdmin()
	}
	if c.metricsAddr != "" {
		closeMetrics, err := serveMetrics(ctx, c.metricsAddr, rt, log)
		if err != nil {
			ln.Close()
			return err
		}
		defer closeMetrics()
	}
	srv := httpserve.New(httpserve.Config{
		Name:     "api",
		Handler:  tr.Handler(httpapi.LogRequests(log, handler), "chargeonce"),
		Logger:   log,
		MaxConns: c.maxConns,
		// A charge may wait for a slot, then for the acquirer.
		WriteTimeout: c.admissionWait + c.acq.timeout + handlerSlack,
		// Health checks are never stopped (SPEC "Tenants share the
		// service fairly"): a reserve of connections serves nothing else.
		Reserved: httpapi.HealthCheck,
	})
	rt.metrics.Connections("api", srv.Stats)
	rt.start(ctx)
	defer rt.stop()

	log.Info("chargeonce listening", "addr", ln.Addr().String(), "db", redactURL(c.db), "acquirer", c.acq.target,
		"lease", c.lease, "key_ttl", c.keyTTL)
	return serveUntilDone(ctx, srv, ln, log)
}

// handlerSlack is what a listener's write timeout allows on top of the
// longest wait a handler knows of (admission, an acquirer call): database
// writes and a loaded machine.
const handlerSlack = 30 * time.Second

// serveUntilDone serves on ln until ctx ends, then shuts srv down, giving
// requests in flight shutdownTimeout to finish.
func serveUntilDone(ctx context.Context, srv *httpserve.Server, ln net.Listener, log *slog.Logger) error {
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
// migrates --db (PostgreSQL with pgOpts).
func storeFor(ctx context.Context, db string, pgOpts ...postgres.Option) (chargeonce.Store, error) {
	store, err := openStore(ctx, db, pgOpts...)
	if err != nil {
		return nil, err
	}
	if err := store.Migrate(ctx); err != nil {
		store.Close()
		return nil, fmt.Errorf("migrating %s: %w", redactURL(db), err)
	}
	return store, nil
}

// keys returns the API keys from --api-keys or --api-keys-file, or the demo
// key on loopback when neither is given. Secrets never reach the log.
func (c *serveConfig) keys(log *slog.Logger) (*httpapi.Keys, error) {
	switch {
	case c.apiKeys != "" && c.apiKeysFile != "":
		return nil, fmt.Errorf("give --api-keys or --api-keys-file, not both (or their environment twins CHARGEONCE_API_KEYS and CHARGEONCE_API_KEYS_FILE)")
	case c.apiKeysFile != "":
		b, err := os.ReadFile(c.apiKeysFile)
		if err != nil {
			return nil, fmt.Errorf("--api-keys-file: %w", err)
		}
		keys, err := httpapi.ParseKeys(string(b))
		if err != nil {
			return nil, fmt.Errorf("--api-keys-file %s: %w", c.apiKeysFile, err)
		}
		return keys, nil
	case c.apiKeys != "":
		keys, err := httpapi.ParseKeys(c.apiKeys)
		if err != nil {
			return nil, fmt.Errorf("--api-keys: %w", err)
		}
		return keys, nil
	}
	if !isLoopback(c.addr) {
		return nil, fmt.Errorf("--api-keys or --api-keys-file is required when --addr (%s) is not a loopback address: the demo key is public", c.addr)
	}
	log.Warn("no --api-keys configured: running with the demo merchant \"demo\" and key sk_test_demo (loopback only: it answers requests to localhost, 127.0.0.1 and [::1])")
	return httpapi.LoopbackDemoKeys(), nil
}

// withSimulator mounts the in-process simulator's API under /acquirer, so
// operators and tests can read its captures and stats, but only when serve
// listens on loopback: that API has no authentication and lists every
// merchant's captures. (serve refuses the simulator off loopback anyway;
// this keeps the mount safe on its own.) It answers only requests to a
// loopback Host, as the demo keys do: a page on a DNS name rebound to
// 127.0.0.1 reaches a loopback listener too.
func withSimulator(api http.Handler, sim *acquirer.Simulator, addr string) http.Handler {
	if sim == nil || !isLoopback(addr) {
		return api
	}
	sims := http.StripPrefix("/acquirer", acquirer.Handler(sim))
	mux := http.NewServeMux()
	mux.Handle("/acquirer/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !httpserve.LoopbackHost(r.Host) {
			http.Error(w, "the simulator answers only requests to localhost, 127.0.0.1 or [::1]", http.StatusForbidden)
			return
		}
		sims.ServeHTTP(w, r)
	}))
	mux.Handle("/", api)
	return mux
}
