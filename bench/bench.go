// Package bench is `chargeonce bench`: it holds chargeonce against the floor
// that any design pays for HTTP plus the database, side by side in one run.
//
// Three workloads run at each concurrency with closed-loop clients (each
// client sends its next request when the previous one is answered):
//
//   - new: every request a fresh key: insert, acquirer, store the response;
//   - replay: keys that already have a stored response (the retry storm
//     after a timeout);
//   - contended: groups of Group clients send the same key at the same
//     moment, wait for each other, and move on to the next key together.
//
// Each one runs three ways, interleaved round by round in one run so that
// drift of the machine cancels out of the ratios:
//
//   - chargeonce: the real `chargeonce serve` in a child process, over HTTP
//     on loopback, with the acquirer simulator in-process at zero latency;
//   - bare-http: a minimal net/http handler, also in a child process, that
//     runs the very statements the store runs (postgres.Statements,
//     sqlite.Statements) and the same simulator, with no idempotency logic,
//     no validation and no auth: the floor for HTTP plus the database;
//   - raw-sql: the same statements and simulator in this process, with no
//     HTTP at all.
//
// The servers run in child processes so that the peak RSS reported is the
// server's own and not the load generator's. Latencies go into HDR
// histograms (github.com/HdrHistogram/hdrhistogram-go).
//
// The run works in a database of its own: on PostgreSQL a fresh schema
// (created and dropped by the run), on SQLite fresh files (created and
// removed). The last line it prints is
//
//	ratios: new=X.XX replay=Y.YY contended=Z.ZZ
//
// chargeonce's throughput over bare-http's at RatioClients clients.
package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/chargeonce/chargeonce"
)

// Defaults of Config (and of the flags of `chargeonce bench`). With them a
// whole run takes about two and a half minutes on a 2-core machine.
const (
	// DefaultDB is the database when neither --db nor TEST_DATABASE_URL
	// names one: the PostgreSQL the tests use.
	DefaultDB          = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	DefaultDuration    = 3 * time.Second
	DefaultRounds      = 3
	DefaultWarmup      = 250 * time.Millisecond
	DefaultConcurrency = "1,16,64"
	DefaultWorkloads   = "new,replay,contended"
	DefaultGroup       = 8
	DefaultReplayKeys  = 2000
	DefaultPreload     = 1_000_000
)

// RatioClients is the concurrency the final ratios line reports. When a run
// does not include it, the concurrency nearest to it is used.
const RatioClients = 16

// The workloads.
const (
	WorkloadNew       = "new"
	WorkloadReplay    = "replay"
	WorkloadContended = "contended"
)

// merchant is the one merchant the benchmark charges for; children get an
// API key for it. webhooksMerchant is the merchant of the webhooks way, the
// only one with a webhook endpoint.
const (
	merchant         = "bench"
	webhooksMerchant = "bench-webhooks"
)

// Config configures Run. Each field mirrors a flag of `chargeonce bench`,
// and errors name the flag.
type Config struct {
	// DB is postgres://… or sqlite:PATH. On PostgreSQL the run creates a
	// schema of its own and drops it at the end. On SQLite PATH must not
	// exist: the run creates it (and PATH.empty, PATH.preloaded for the
	// preloaded comparison) and removes them at the end.
	DB string
	// Pooler, when set, is a postgres:// URL of a connection pooler
	// (PgBouncer in transaction mode) in front of DB's server that serves
	// any database name (a `* = host=… port=…` line). The run then creates
	// a database of its own through DB (a schema's search_path cannot travel
	// through a pooler), migrates it on DB's direct connection, as
	// migrations require, and runs every way that talks to PostgreSQL
	// (chargeonce, raw SQL, minimal) through the pooler. It drops the
	// database at the end.
	Pooler string
	// Duration is how long each way is measured per workload and
	// concurrency, split into Rounds interleaved slices.
	Duration time.Duration
	Rounds   int
	// Warmup is run by each way before each workload and concurrency,
	// unmeasured, to open connections and warm caches.
	Warmup      time.Duration
	Concurrency []int
	Workloads   []string
	// Group is how many clients share each key in the contended workload.
	Group int
	// ReplayKeys is how many completed keys the replay workload cycles
	// through.
	ReplayKeys int
	// Preload is how many keys the preloaded comparison puts in the table
	// before measuring new against an empty table; 0 skips it.
	Preload int
	// Webhooks adds the way chargeonce+webhooks: a second chargeonce whose
	// merchant has a webhook endpoint on loopback, so every settlement
	// writes its event and the instance delivers it (--webhooks).
	Webhooks bool
	// Refunds adds the refunds comparison (--refunds): refunds of captured
	// charges, new and replayed, beside new charges and the minimal
	// design's, at the ratio concurrency.
	Refunds bool
	// Runs is how many times the whole benchmark runs back to back (--runs);
	// with more than one, a summary of the minimum of each ratio over the
	// runs follows the last run's report, since a target is met only when
	// every run meets it, not the best. 0 means 1.
	Runs int
	// ProfileDir, when set, receives CPU profiles of the chargeonce and
	// bare-http servers under the new and replay workloads at RatioClients,
	// and with Refunds of the server under new refunds (refund-new.pprof),
	// taken in extra unmeasured runs.
	ProfileDir string
	// ChildCommand returns the command that runs Child(ctx, args, …) in a
	// new process: `chargeonce bench child ARGS…`.
	ChildCommand func(args []string) *exec.Cmd
	// Out receives the results; Log the progress and the children's logs.
	Out, Log io.Writer
}

// ParseConcurrency parses a comma-separated list of client counts.
func ParseConcurrency(s string) ([]int, error) {
	var cs []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		var n int
		if _, err := fmt.Sscanf(f, "%d", &n); err != nil || n < 1 || fmt.Sprint(n) != f {
			return nil, fmt.Errorf("--concurrency must be positive client counts separated by commas, as in %s; got %q", DefaultConcurrency, s)
		}
		cs = append(cs, n)
	}
	if len(cs) == 0 {
		return nil, fmt.Errorf("--concurrency must name at least one client count")
	}
	return cs, nil
}

// ParseWorkloads parses a comma-separated list of workload names.
func ParseWorkloads(s string) ([]string, error) {
	var ws []string
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		switch f {
		case "":
			continue
		case WorkloadNew, WorkloadReplay, WorkloadContended:
			ws = append(ws, f)
		default:
			return nil, fmt.Errorf("--workloads must be among %s; got %q", DefaultWorkloads, f)
		}
	}
	if len(ws) == 0 {
		return nil, fmt.Errorf("--workloads must name at least one workload")
	}
	return ws, nil
}

// validate reports bad configuration, naming the flag.
func (c *Config) validate() error {
	switch {
	case !isPostgres(c.DB) && !strings.HasPrefix(c.DB, "sqlite:"):
		return fmt.Errorf("--db must be postgres://… or sqlite:PATH; got %q", redactURL(c.DB))
	case strings.HasPrefix(c.DB, "sqlite:") && strings.TrimPrefix(c.DB, "sqlite:") == "":
		return fmt.Errorf("--db: sqlite: needs a file path, as in sqlite:bench.db")
	case c.Pooler != "" && !isPostgres(c.DB):
		return fmt.Errorf("--pooler needs a postgres:// --db to create the run's database through; got %q", redactURL(c.DB))
	case c.Pooler != "" && !isPostgres(c.Pooler):
		return fmt.Errorf("--pooler must be a postgres:// URL; got %q", redactURL(c.Pooler))
	case c.Duration <= 0:
		return fmt.Errorf("--duration must be positive; got %s", c.Duration)
	case c.Rounds < 1:
		return fmt.Errorf("--rounds must be at least 1; got %d", c.Rounds)
	case c.Duration/time.Duration(c.Rounds) < 10*time.Millisecond:
		return fmt.Errorf("--duration / --rounds must be at least 10ms; got %s", c.Duration/time.Duration(c.Rounds))
	case c.Warmup < 0:
		return fmt.Errorf("--warmup must not be negative; got %s", c.Warmup)
	case len(c.Concurrency) == 0:
		return fmt.Errorf("--concurrency must name at least one client count")
	case len(c.Workloads) == 0:
		return fmt.Errorf("--workloads must name at least one workload")
	case c.Group < 2:
		return fmt.Errorf("--group must be at least 2; got %d", c.Group)
	case c.ReplayKeys < 1:
		return fmt.Errorf("--replay-keys must be at least 1; got %d", c.ReplayKeys)
	case c.Runs < 0:
		return fmt.Errorf("--runs must be at least 1; got %d", c.Runs)
	case c.Preload < 0:
		return fmt.Errorf("--preload must not be negative; got %d", c.Preload)
	case c.ChildCommand == nil:
		return errors.New("bench: Config.ChildCommand is required")
	}
	for _, n := range c.Concurrency {
		if n < 1 {
			return fmt.Errorf("--concurrency must be positive; got %d", n)
		}
	}
	return nil
}

// Run runs the benchmark and prints its results to cfg.Out, ending with
// the ratios line. It cleans up after itself (children stopped, schema
// dropped or files removed) also when ctx is cancelled or it fails.
func Run(ctx context.Context, cfg Config) error {
	if cfg.Out == nil {
		cfg.Out = io.Discard
	}
	if cfg.Log == nil {
		cfg.Log = io.Discard
	}
	if err := cfg.validate(); err != nil {
		return err
	}
	if cfg.Runs <= 1 {
		_, err := runOnce(ctx, cfg)
		return err
	}
	var runs []*bench
	for i := 1; i <= cfg.Runs; i++ {
		fmt.Fprintf(cfg.Out, "== run %d of %d ==\n", i, cfg.Runs)
		b, err := runOnce(ctx, cfg)
		if err != nil {
			return fmt.Errorf("run %d of %d: %w", i, cfg.Runs, err)
		}
		runs = append(runs, b)
		fmt.Fprintln(cfg.Out)
	}
	reportRuns(cfg.Out, runs)
	return nil
}

// runOnce is one run of the benchmark; it returns the run for the summary
// of --runs.
func runOnce(ctx context.Context, cfg Config) (_ *bench, err error) {
	b := &bench{cfg: cfg, log: cfg.Log, runID: randHex(4), secret: "sk_bench_" + randHex(16)}
	b.postgres = isPostgres(cfg.DB)
	b.loadStart = loadAverage()
	b.started = time.Now()

	defer func() {
		cerr := b.cleanup()
		if err == nil {
			err = cerr
		}
	}()
	if err := b.setup(ctx); err != nil {
		return nil, err
	}
	if err := b.measure(ctx); err != nil {
		return nil, err
	}
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	b.stopChildren()
	if cfg.Refunds {
		if err := b.measureRefunds(ctx); err != nil {
			return nil, fmt.Errorf("--refunds: %w", err)
		}
	}
	if !b.postgres && slices.Contains(cfg.Workloads, WorkloadNew) {
		if err := b.measureSync(ctx); err != nil {
			return nil, err
		}
	}
	if cfg.Preload > 0 && slices.Contains(cfg.Workloads, WorkloadNew) {
		if err := b.measurePreloaded(ctx); err != nil {
			return nil, err
		}
	}
	b.loadEnd = loadAverage()
	b.report()
	return b, nil
}

// bench is one run.
type bench struct {
	cfg      Config
	log      io.Writer
	runID    string
	secret   string
	postgres bool

	// The database: base is what --db named; main the URL (or path) of the
	// run's own schema (or file).
	main     string
	schemas  []string // PostgreSQL schemas to drop
	dbs      []string // PostgreSQL databases to drop (--pooler)
	files    []string // SQLite files to remove
	parent   *parentStore
	children []*child
	ways     []*way
	webhooks *webhookReceiver

	replayKeys []string

	orders    atomic.Int64 // order ids of the new workload
	slices    int          // slices run, for unique contended keys
	results   []*result
	rss       []rssRow
	preloaded *preloadResult
	sync      *syncResult // SQLite: synchronous=FULL against NORMAL
	refunds   *refundResults
	checks    []string

	loadStart, loadEnd string
	started            time.Time
}

// ratioClients returns the concurrency the ratios are taken at.
func (b *bench) ratioClients() int {
	best := b.cfg.Concurrency[0]
	for _, c := range b.cfg.Concurrency {
		if abs(c-RatioClients) < abs(best-RatioClients) {
			best = c
		}
	}
	return best
}

func abs(n int) int {
	if n < 0 {
		return -n
	}
	return n
}

func (b *bench) logf(format string, args ...any) {
	fmt.Fprintf(b.log, "bench: "+format+"\n", args...)
}

// cleanup stops the children and removes what the run created.
func (b *bench) cleanup() error {
	b.stopChildren()
	if b.parent != nil {
		b.parent.close()
	}
	return b.dropDatabases()
}

func (b *bench) stopChildren() {
	b.webhooks.close()
	for _, c := range b.children {
		c.stop()
	}
	b.children = nil
}

// loadAverage returns the 1, 5 and 15 minute load averages, or "n/a".
func loadAverage() string {
	raw, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "n/a"
	}
	f := strings.Fields(string(raw))
	if len(f) < 3 {
		return "n/a"
	}
	return strings.Join(f[:3], " ")
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never fails on supported platforms
	return hex.EncodeToString(b)
}

func isPostgres(db string) bool {
	return strings.HasPrefix(db, "postgres://") || strings.HasPrefix(db, "postgresql://")
}

// redactURL hides a password in a database URL.
func redactURL(s string) string {
	if i := strings.Index(s, "@"); i > 0 {
		if j := strings.Index(s, "://"); j >= 0 && j < i {
			if k := strings.Index(s[j+3:i], ":"); k >= 0 {
				return s[:j+3+k] + ":…" + s[i:]
			}
		}
	}
	return s
}

// chargeRequest is the body every client sends, decoded: the bare handler
// decodes into it (without validating it) and the raw-SQL way runs on it.
type chargeRequest = chargeonce.ChargeRequest

// The fields of every request the benchmark sends.
const (
	benchAmount   = 2500
	benchCurrency = chargeonce.DefaultCurrency
	benchToken    = "tok_ok"
	// replayOrderID is the order of every replayed intent: a replay must
	// send the request its key was first used for.
	replayOrderID = 4242
)
