package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime/debug"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/postgres"
	"github.com/chargeonce/chargeonce/tracing"
)

// startTracing sets up OpenTelemetry tracing for a command when the
// environment asks for it (OTEL_EXPORTER_OTLP_ENDPOINT, see package
// tracing), and returns nil (tracing off: nothing installed) when it does
// not. stop exports the last spans; call it before the command returns.
func startTracing(ctx context.Context, command string, log *slog.Logger) (tr *tracing.Tracing, stop func(), err error) {
	bi, _ := debug.ReadBuildInfo()
	tr, err = tracing.Setup(ctx, "chargeonce-"+command, readBuildInfo(version, commit, bi).Version)
	if err != nil {
		return nil, nil, err
	}
	if tr == nil {
		return nil, func() {}, nil
	}
	endpoint := os.Getenv(tracing.EnvTracesEndpoint)
	if endpoint == "" {
		endpoint = os.Getenv(tracing.EnvEndpoint)
	}
	log.Info("tracing: exporting spans over OTLP/HTTP", "endpoint", redactURL(endpoint))
	return tr, func() {
		if err := tr.Shutdown(context.WithoutCancel(ctx)); err != nil {
			log.Warn("tracing: the last spans were not exported", "err", err)
		}
	}, nil
}

// postgresTracing is the option that traces a PostgreSQL store's
// statements and batches; none when tr is nil.
func postgresTracing(tr *tracing.Tracing) []postgres.Option {
	if tr == nil {
		return nil
	}
	return []postgres.Option{postgres.WithTracerProvider(tr.TracerProvider())}
}

// traceStore wraps store's calls in spans (tr nil: store itself).
func traceStore(tr *tracing.Tracing, store chargeonce.Store) chargeonce.Store {
	system := "sqlite"
	if _, ok := store.(*postgres.Store); ok {
		system = "postgresql"
	}
	return tr.Store(store, system)
}

// withTracingHelp ends the --help of a command that traces with how to
// turn tracing on, which no flag does.
func withTracingHelp(fs *flag.FlagSet, w io.Writer) {
	usage := fs.Usage
	fs.Usage = func() {
		usage()
		fmt.Fprintf(w, "\nTracing: set %s (OTLP/HTTP, such as http://localhost:4318) to export OpenTelemetry traces (docs/operations.md).\n", tracing.EnvEndpoint)
	}
}
