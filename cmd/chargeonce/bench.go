package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"

	"github.com/chargeonce/chargeonce/bench"
)

// benchChild is the hidden sub-command of `bench` that runs one of the
// benchmark's servers in a process of its own (see bench.Child).
const benchChild = "child"

// benchDefaultDB is --db's default for `bench`: the PostgreSQL the tests use
// (TEST_DATABASE_URL), else bench.DefaultDB. Unlike `serve`, the benchmark
// does not default to SQLite: the targets are set on PostgreSQL.
func benchDefaultDB() string {
	if u := os.Getenv("TEST_DATABASE_URL"); u != "" {
		return u
	}
	return bench.DefaultDB
}

// runBench is `chargeonce bench`: chargeonce against a bare net/http handler
// and raw SQL running the same statements; see package bench.
func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == benchChild {
		return bench.Child(ctx, args[1:], func(ctx context.Context, serveArgs []string) error {
			return runServe(ctx, serveArgs, stdout, stderr)
		}, stderr)
	}
	cfg := bench.Config{Out: stdout, Log: stderr}
	var concurrency, workloads string
	fs := newFlagSet("bench", stderr)
	fs.StringVar(&cfg.DB, "db", benchDefaultDB(), "database: postgres://… (the run creates a schema of its own and drops it) or sqlite:PATH (PATH must not exist; created and removed); default TEST_DATABASE_URL, else "+bench.DefaultDB)
	fs.StringVar(&cfg.Pooler, "pooler", "", "postgres:// URL of a pooler (PgBouncer, transaction mode) in front of --db's server, serving any database name: the run creates a database of its own through --db, migrates it directly, and measures every way through the pooler")
	fs.DurationVar(&cfg.Duration, "duration", bench.DefaultDuration, "how long each way is measured per workload and concurrency")
	fs.IntVar(&cfg.Rounds, "rounds", bench.DefaultRounds, "interleaved rounds the duration is split into, the order of the ways rotating each round")
	fs.DurationVar(&cfg.Warmup, "warmup", bench.DefaultWarmup, "unmeasured warm-up of each way before each workload and concurrency")
	fs.StringVar(&concurrency, "concurrency", bench.DefaultConcurrency, "closed-loop client counts, comma-separated")
	fs.StringVar(&workloads, "workloads", bench.DefaultWorkloads, "workloads to run, comma-separated: new, replay, contended")
	fs.BoolVar(&cfg.Webhooks, "webhooks", false, "add the way chargeonce+webhooks: a merchant with a webhook endpoint on loopback, every settlement writing and delivering its event, to report what webhooks cost")
	fs.BoolVar(&cfg.Refunds, "refunds", false, "add the refunds comparison: POST /v1/charges/{id}/refunds, new and replayed, beside new charges and the minimal design's, at the ratio concurrency")
	fs.IntVar(&cfg.Group, "group", bench.DefaultGroup, "clients sending the same key at once in the contended workload")
	fs.IntVar(&cfg.ReplayKeys, "replay-keys", bench.DefaultReplayKeys, "completed keys the replay workload cycles through")
	fs.IntVar(&cfg.Preload, "preload", bench.DefaultPreload, "keys put in the table before new is measured against an empty table; 0 skips that comparison")
	fs.IntVar(&cfg.Runs, "runs", 1, "run the whole benchmark this many times back to back and end with the minimum of each ratio over the runs")
	fs.StringVar(&cfg.ProfileDir, "profile", "", "directory to write CPU profiles of the servers under new and replay to (extra, unmeasured runs)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	var err error
	if cfg.Concurrency, err = bench.ParseConcurrency(concurrency); err != nil {
		return err
	}
	if cfg.Workloads, err = bench.ParseWorkloads(workloads); err != nil {
		return err
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("finding this executable to start the benchmark's servers: %w", err)
	}
	cfg.ChildCommand = func(childArgs []string) *exec.Cmd {
		// G204: our own binary (os.Executable), with the arguments bench
		// builds. noctx: bench stops its servers itself, SIGTERM first so
		// they shut down gracefully; a context would SIGKILL them.
		return exec.Command(exe, append([]string{"bench", benchChild}, childArgs...)...) //nolint:gosec,noctx // see above
	}
	return bench.Run(ctx, cfg)
}
