package bench_test

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/bench"
	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/httpapi"
	"github.com/chargeonce/chargeonce/internal/apitest"
	"github.com/chargeonce/chargeonce/internal/pgtest"
	"github.com/chargeonce/chargeonce/postgres"
	"github.com/chargeonce/chargeonce/replaycache"
	"github.com/chargeonce/chargeonce/sqlite"
)

// childEnv marks a run of this test binary as one of Run's child servers.
const childEnv = "BENCH_TEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		err := bench.Child(ctx, os.Args[1:], serve, os.Stderr)
		stop()
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench child:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	pgtest.VerifyMain(m)
}

// serve stands in for `chargeonce serve` (which lives in package main and
// has its own end-to-end test of the benchmark): the same store, replay
// cache, engine, API and mounted simulator, on the flags Child passes.
func serve(ctx context.Context, args []string) error {
	var addr, db, apiKeys, acq, level, merchantRate string
	var latency time.Duration
	var merchantBurst int
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.StringVar(&addr, "addr", "", "")
	fs.StringVar(&db, "db", "", "")
	fs.StringVar(&apiKeys, "api-keys", "", "")
	fs.StringVar(&acq, "acquirer", "", "")
	fs.DurationVar(&latency, "latency", 0, "")
	fs.StringVar(&level, "log-level", "", "")
	fs.StringVar(&merchantRate, "merchant-rate", "", "")
	fs.IntVar(&merchantBurst, "merchant-burst", 0, "")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var (
		store chargeonce.Store
		err   error
	)
	if strings.HasPrefix(db, "sqlite:") {
		store, err = sqlite.Open(ctx, strings.TrimPrefix(db, "sqlite:"))
	} else {
		store, err = postgres.Open(ctx, db)
	}
	if err != nil {
		return err
	}
	defer store.Close()
	if err := store.Migrate(ctx); err != nil {
		return err
	}
	keys, err := httpapi.ParseKeys(apiKeys)
	if err != nil {
		return err
	}
	sim := acquirer.NewSimulator(acquirer.Options{Latency: latency})
	defer sim.Close()
	perSecond, err := engine.ParsePerSecond(merchantRate)
	if err != nil {
		return err
	}
	eng := engine.New(replaycache.New(store, replaycache.Options{}), sim, engine.Options{
		MerchantRate: engine.Rate{PerSecond: perSecond, Burst: merchantBurst},
	})
	mux := http.NewServeMux()
	mux.Handle("/acquirer/", http.StripPrefix("/acquirer", acquirer.Handler(sim)))
	mux.Handle("/", httpapi.New(httpapi.Config{Engine: eng, Store: store, Keys: keys, Logger: slog.New(slog.DiscardHandler)}))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	<-ctx.Done()
	return srv.Shutdown(context.Background())
}

// tiny is a run small enough for every CI run: two concurrencies, all
// workloads, a preloaded comparison, under half a second per way: slices of
// 200 ms, so that every way completes requests in each slice even when
// other test binaries load the machine (75 ms slices saw none, at a load
// average of 16 on 2 cores).
func tiny(db string, out, log *apitest.Buffer) bench.Config {
	exe := os.Args[0]
	return bench.Config{
		DB:          db,
		Duration:    400 * time.Millisecond,
		Rounds:      2,
		Warmup:      20 * time.Millisecond,
		Concurrency: []int{1, 4},
		Workloads:   []string{bench.WorkloadNew, bench.WorkloadReplay, bench.WorkloadContended},
		Group:       2,
		ReplayKeys:  40,
		Preload:     500,
		ChildCommand: func(args []string) *exec.Cmd {
			cmd := exec.Command(exe, args...)
			cmd.Env = append(os.Environ(), childEnv+"=1")
			return cmd
		},
		Out: out,
		Log: log,
	}
}

var ratiosLine = regexp.MustCompile(`^ratios: new=(\d+\.\d\d) replay=(\d+\.\d\d) contended=(\d+\.\d\d) new_vs_minimal=(\d+\.\d\d) contended_vs_minimal=(\d+\.\d\d)$`)

// checkOutput checks the report's shape: every workload, concurrency and
// way has a row without errors, and the last line holds three ratios.
func checkOutput(t *testing.T, out, log string) {
	t.Helper()
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	m := ratiosLine.FindStringSubmatch(lines[len(lines)-1])
	if m == nil {
		t.Fatalf("last line %q is not a ratios line\n%s", lines[len(lines)-1], out)
	}
	for i, name := range []string{"new", "replay", "contended", "new_vs_minimal", "contended_vs_minimal"} {
		r, err := strconv.ParseFloat(m[i+1], 64)
		if err != nil || r <= 0 {
			t.Errorf("ratio %s = %q, want a positive number", name, m[i+1])
		}
	}
	row := regexp.MustCompile(`^\s*(new|replay|contended)\s+(\d+)\s+(chargeonce|bare-http|raw-sql|minimal)\s+(\d+)\s+\S+\s+\S+\s+(\d+)\b`)
	seen := map[string]bool{}
	for _, l := range lines {
		r := row.FindStringSubmatch(l)
		if r == nil {
			continue
		}
		seen[r[1]+"/"+r[2]+"/"+r[3]] = true
		if r[5] != "0" {
			t.Errorf("errors in %q\n%s", l, log)
		}
		if rps, _ := strconv.Atoi(r[4]); rps <= 0 {
			t.Errorf("no throughput in %q", l)
		}
	}
	for _, c := range []string{"1", "4"} {
		for _, wl := range []string{"new", "replay", "contended"} {
			if wl == "contended" && c == "1" {
				continue
			}
			for _, way := range []string{"chargeonce", "bare-http", "raw-sql", "minimal"} {
				if way == "minimal" && wl == "replay" {
					if seen[wl+"/"+c+"/"+way] {
						t.Errorf("a replay row for the minimal way, which has no stored responses\n%s", out)
					}
					continue
				}
				if !seen[wl+"/"+c+"/"+way] {
					t.Errorf("no row for %s at %s clients, %s\n%s", wl, c, way, out)
				}
			}
		}
	}
	for _, want := range []string{
		"peak RSS of the server processes",
		"with 500 keys already in the table",
		"0 keys with more than one charge",
		"0 duplicate requests",
		"targets at 4 clients:",
		"cost per answered request",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the report lacks %q\n%s", want, out)
		}
	}
}

func TestRunSQLite(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "bench.db")
	var out, log apitest.Buffer
	if err := bench.Run(context.Background(), tiny("sqlite:"+path, &out, &log)); err != nil {
		t.Fatalf("Run: %v\n%s", err, log.String())
	}
	checkOutput(t, out.String(), log.String())
	// The write cost of synchronous=FULL, which the store runs, against
	// NORMAL, measured in the same run.
	if !regexp.MustCompile(`sqlite-sync: .* synchronous=FULL [1-9][0-9]*/s, NORMAL [1-9][0-9]*/s: FULL/NORMAL=[0-9.]+`).MatchString(out.String()) {
		t.Errorf("the report lacks the sqlite-sync comparison\n%s", out.String())
	}
	matches, _ := filepath.Glob(path + "*")
	if len(matches) != 0 {
		t.Errorf("the run left %v behind", matches)
	}
}

func TestRunPostgres(t *testing.T) {
	t.Parallel()
	base := pgtest.AdminURL(t)
	var out, log apitest.Buffer
	if err := bench.Run(context.Background(), tiny(base, &out, &log)); err != nil {
		t.Fatalf("Run: %v\n%s", err, log.String())
	}
	checkOutput(t, out.String(), log.String())

	m := regexp.MustCompile(`search_path=(chargeonce_bench_[0-9a-f]+)`).FindStringSubmatch(log.String())
	if m == nil {
		t.Fatalf("the log does not name the run's schema\n%s", log.String())
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var left int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM information_schema.schemata WHERE schema_name LIKE $1 || '%'`, m[1]).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Errorf("%d of the run's schemas are left behind", left)
	}
}

// Through a real PgBouncer in transaction mode: the run creates a database
// of its own, migrates it directly, measures every way through the pooler
// and drops the database at the end.
func TestRunThroughPgBouncer(t *testing.T) {
	t.Parallel()
	base := pgtest.AdminURL(t)
	pooler := pgtest.PgBouncerServer(t, base)
	var out, log apitest.Buffer
	cfg := tiny(base, &out, &log)
	cfg.Pooler = pooler
	if err := bench.Run(context.Background(), cfg); err != nil {
		t.Fatalf("Run: %v\n%s", err, log.String())
	}
	checkOutput(t, out.String(), log.String())
	if !strings.Contains(out.String(), "through the pooler") {
		t.Errorf("the report does not say it ran through the pooler\n%s", out.String())
	}
	m := regexp.MustCompile(`/(chargeonce_bench_[0-9a-f]+)\?`).FindStringSubmatch(log.String())
	if m == nil {
		t.Fatalf("the log does not name the run's database\n%s", log.String())
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var left int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_database WHERE datname LIKE $1 || '%'`, m[1]).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Errorf("%d of the run's databases are left behind", left)
	}
}

// A --pooler that reaches PostgreSQL directly would measure cached
// statements: the run refuses it, naming the flag, and leaves nothing.
func TestDirectPoolerIsRefused(t *testing.T) {
	t.Parallel()
	base := pgtest.AdminURL(t)
	var out, log apitest.Buffer
	cfg := tiny(base, &out, &log)
	cfg.Pooler = base
	err := bench.Run(context.Background(), cfg)
	if err == nil || !strings.Contains(err.Error(), "--pooler") || !strings.Contains(err.Error(), "directly") {
		t.Fatalf("Run: %v, want an error naming --pooler", err)
	}
}

func TestExistingSQLiteFileIsRefused(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "precious.db")
	if err := os.WriteFile(path, []byte("not yours"), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, log apitest.Buffer
	err := bench.Run(context.Background(), tiny("sqlite:"+path, &out, &log))
	if err == nil || !strings.Contains(err.Error(), "--db") {
		t.Fatalf("Run: %v, want an error naming --db", err)
	}
	if b, _ := os.ReadFile(path); string(b) != "not yours" {
		t.Fatalf("the file was changed to %q", b)
	}
}

func TestBadConfigurationNamesTheFlag(t *testing.T) {
	t.Parallel()
	for flagName, mod := range map[string]func(c *bench.Config){
		"--db":       func(c *bench.Config) { c.DB = "mysql://x" },
		"--duration": func(c *bench.Config) { c.Duration = 0 },
		"--rounds":   func(c *bench.Config) { c.Rounds = 0 },
		"--warmup":   func(c *bench.Config) { c.Warmup = -time.Second },
		"--group":    func(c *bench.Config) { c.Group = 1 },
		"--preload":  func(c *bench.Config) { c.Preload = -1 },
		"--pooler":   func(c *bench.Config) { c.Pooler = "mysql://x" },
	} {
		var out, log apitest.Buffer
		cfg := tiny("sqlite:"+filepath.Join(t.TempDir(), "b.db"), &out, &log)
		mod(&cfg)
		if err := bench.Run(context.Background(), cfg); err == nil || !strings.Contains(err.Error(), flagName) {
			t.Errorf("%s: error %v, want one naming it", flagName, err)
		}
	}
	for _, tc := range []struct{ in, flag string }{{"1,x", "--concurrency"}, {"0", "--concurrency"}, {"", "--concurrency"}} {
		if _, err := bench.ParseConcurrency(tc.in); err == nil || !strings.Contains(err.Error(), tc.flag) {
			t.Errorf("ParseConcurrency(%q): %v", tc.in, err)
		}
	}
	if cs, err := bench.ParseConcurrency("1, 16,64"); err != nil || fmt.Sprint(cs) != "[1 16 64]" {
		t.Errorf("ParseConcurrency = %v, %v", cs, err)
	}
	if _, err := bench.ParseWorkloads("new,bogus"); err == nil || !strings.Contains(err.Error(), "--workloads") {
		t.Errorf("ParseWorkloads: %v", err)
	}
}

// TestRunsReportTheMinimum runs the benchmark twice back to back (--runs 2)
// and checks that the summary's ratios line holds, for each ratio, the
// smaller of the two runs' ratios lines.
func TestRunsReportTheMinimum(t *testing.T) {
	t.Parallel()
	base := pgtest.AdminURL(t)
	var out, log apitest.Buffer
	cfg := tiny(base, &out, &log)
	cfg.Runs, cfg.Preload = 2, 0
	if err := bench.Run(context.Background(), cfg); err != nil {
		t.Fatalf("Run: %v\n%s", err, log.String())
	}
	var perRun [][]float64
	var summary []float64
	summaryLine := regexp.MustCompile(`^ratios \(minimum of 2 runs\): new=(\d+\.\d\d) replay=(\d+\.\d\d) contended=(\d+\.\d\d) new_vs_minimal=(\d+\.\d\d) contended_vs_minimal=(\d+\.\d\d)$`)
	parse := func(m []string) []float64 {
		var fs []float64
		for _, s := range m[1:] {
			f, err := strconv.ParseFloat(s, 64)
			if err != nil {
				t.Fatal(err)
			}
			fs = append(fs, f)
		}
		return fs
	}
	for _, line := range strings.Split(out.String(), "\n") {
		if m := ratiosLine.FindStringSubmatch(line); m != nil {
			perRun = append(perRun, parse(m))
		}
		if m := summaryLine.FindStringSubmatch(line); m != nil {
			summary = parse(m)
		}
	}
	if len(perRun) != 2 || summary == nil {
		t.Fatalf("want 2 runs' ratios lines and the summary's; got %d and %v\n%s", len(perRun), summary, out.String())
	}
	for i := range summary {
		if want := min(perRun[0][i], perRun[1][i]); summary[i] != want {
			t.Errorf("ratio %d: summary %.2f, want the minimum of %.2f and %.2f", i, summary[i], perRun[0][i], perRun[1][i])
		}
	}
	if !strings.Contains(out.String(), "== run 2 of 2 ==") || !strings.Contains(out.String(), "over 2 back-to-back runs") {
		t.Errorf("the report lacks the runs' headings or summary table\n%s", out.String())
	}
}

// TestRunRefunds: --refunds measures refunds of captured charges, new and
// replayed, beside new charges and the minimal design's, every request
// answered as it should be (a new refund 201 unflagged, a replay flagged).
func TestRunRefunds(t *testing.T) {
	t.Parallel()
	var out, log apitest.Buffer
	cfg := tiny(pgtest.AdminURL(t), &out, &log)
	cfg.Concurrency, cfg.Workloads, cfg.Preload, cfg.Refunds = []int{4}, []string{bench.WorkloadNew, bench.WorkloadReplay}, 0, true
	if err := bench.Run(context.Background(), cfg); err != nil {
		t.Fatalf("Run: %v\n%s", err, log.String())
	}
	report := out.String()
	_, table, ok := strings.Cut(report, "refunds at 4 clients")
	if !ok {
		t.Fatalf("no refunds comparison in the report\n%s", report)
	}
	row := regexp.MustCompile(`(?m)^\s*(new|replay)\s+(charge|refund|minimal)\s+(\d+)\s+\S+\s+\S+\s+(\d+)\b`)
	seen := map[string]bool{}
	for _, r := range row.FindAllStringSubmatch(table, -1) {
		seen[r[1]+"/"+r[2]] = true
		if rps, _ := strconv.Atoi(r[3]); rps <= 0 || r[4] != "0" {
			t.Errorf("refunds row %q: want throughput and no errors\n%s", r[0], log.String())
		}
	}
	for _, want := range []string{"new/charge", "new/refund", "new/minimal", "replay/charge", "replay/refund"} {
		if !seen[want] {
			t.Errorf("no %s row in the refunds comparison\n%s", want, table)
		}
	}
	t.Logf("%s", table)
}
