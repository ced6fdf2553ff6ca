package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/acquirer/stripe"
	"github.com/chargeonce/chargeonce/postgres"
	"github.com/chargeonce/chargeonce/sqlite"
	"github.com/chargeonce/chargeonce/tracing"
)

// Defaults of the command-line flags; durations mirror engine's and
// recovery's defaults.
const (
	DefaultDB           = "sqlite:chargeonce.db"
	DefaultAddr         = "127.0.0.1:8080"
	DefaultAcquirerAddr = "127.0.0.1:8082"
	DefaultAcquirer     = "sim"
	DefaultSlow         = 3 * time.Second
	DefaultLogLevel     = "info"
)

// newFlagSet returns a flag set whose usage lists the command's own flags,
// each with its environment twin.
func newFlagSet(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: chargeonce %s [flags]\n\n", name)
		printFlags(stderr, fs)
	}
	return fs
}

// printFlags writes fs's flags as flag.PrintDefaults does, each followed by
// the environment variable that sets it when the command line does not.
func printFlags(w io.Writer, fs *flag.FlagSet) {
	var b strings.Builder
	fs.SetOutput(&b)
	fs.PrintDefaults()
	fs.SetOutput(w)
	flagLine := regexp.MustCompile(`^  -([a-z0-9-]+)`)
	name := ""
	endFlag := func() {
		if name == "" {
			return
		}
		if noEnvTwin[name] {
			fmt.Fprintln(w, "    \tno environment twin")
		} else {
			fmt.Fprintf(w, "    \tenv %s\n", envName(name))
		}
	}
	for line := range strings.Lines(b.String()) {
		if m := flagLine.FindStringSubmatch(line); m != nil {
			endFlag()
			name = m[1]
		}
		fmt.Fprint(w, line)
	}
	endFlag()
}

// parseFlags parses args, then fills every flag not given on the command
// line from its CHARGEONCE_* environment twin. A bad value names the flag.
//
// A bad flag is a usage error of two lines: what was wrong, and where the
// flag list is. The list itself (dozens of lines, on serve) is printed for
// -h only, where it was asked for.
func parseFlags(fs *flag.FlagSet, args []string) error {
	out, usage := fs.Output(), fs.Usage
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	err := fs.Parse(args)
	fs.SetOutput(out)
	fs.Usage = usage
	switch {
	case errors.Is(err, flag.ErrHelp):
		fs.Usage()
		return err
	case err != nil:
		return usageError(fmt.Sprintf("%v\nRun 'chargeonce %s -h' for its flags.", err, fs.Name()))
	}
	if fs.NArg() > 0 {
		return usageError(fmt.Sprintf("unexpected argument %q\nRun 'chargeonce %s -h' for its flags.", fs.Arg(0), fs.Name()))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	err = nil
	fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] || err != nil || noEnvTwin[f.Name] {
			return
		}
		env := envName(f.Name)
		if v, ok := os.LookupEnv(env); ok {
			if serr := fs.Set(f.Name, v); serr != nil {
				err = fmt.Errorf("invalid value %q for %s (from %s): %w", v, "--"+f.Name, env, serr)
			}
		}
	})
	return err
}

// noEnvTwin lists flags that must come from the command line only: an
// idempotency key left exported in a shell would turn every later
// `chargeonce charge` into the same intent.
var noEnvTwin = map[string]bool{"key": true}

func envName(flagName string) string {
	return "CHARGEONCE_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// openStore opens (without migrating) the store named by a --db value,
// PostgreSQL with pgOpts.
func openStore(ctx context.Context, db string, pgOpts ...postgres.Option) (chargeonce.Store, error) {
	switch {
	case strings.HasPrefix(db, "postgres://"), strings.HasPrefix(db, "postgresql://"):
		s, err := postgres.Open(ctx, db, pgOpts...)
		if err != nil {
			return nil, fmt.Errorf("--db: %w", err)
		}
		return s, nil
	case strings.HasPrefix(db, "sqlite:"):
		path := strings.TrimPrefix(db, "sqlite:")
		if path == "" {
			return nil, fmt.Errorf("--db: sqlite: needs a file path, as in sqlite:chargeonce.db")
		}
		s, err := sqlite.Open(ctx, path)
		if err != nil {
			return nil, fmt.Errorf("--db: %w", err)
		}
		return s, nil
	default:
		return nil, fmt.Errorf("--db must be postgres://… or sqlite:PATH; got %q", redactURL(db))
	}
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

// acquirerFlags are the flags that choose and tune the acquirer.
type acquirerFlags struct {
	target  string
	timeout time.Duration
	slow    time.Duration
	latency time.Duration
	window  time.Duration
	// acceptance is the simulator's acceptance window: the in-process
	// one's, or the remote one's as it was started (SPEC "Finality").
	acceptance time.Duration

	stripeKeyFile   string
	stripeAPIBase   string
	stripeSearchLag time.Duration
	stripeKeyWindow time.Duration
	// tracing, when set, traces the acquirer's HTTP client.
	tracing *tracing.Tracing
	// getenv reads STRIPE_SECRET_KEY; os.Getenv when nil (tests replace it).
	getenv func(string) string
}

// StripeKeyEnv is the environment variable --acquirer stripe reads its
// secret key from, unless --stripe-key-file names a file holding it.
const StripeKeyEnv = "STRIPE_SECRET_KEY"

func (a *acquirerFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&a.target, "acquirer", DefaultAcquirer, "`sim` for the in-process simulator, stripe for Stripe PaymentIntents, or the base URL of a remote acquirer")
	a.registerTimeout(fs)
	fs.DurationVar(&a.slow, "slow", DefaultSlow, "with --acquirer sim: how long tok_slow takes")
	fs.DurationVar(&a.latency, "latency", 0, "with --acquirer sim: a delay added to every capture")
	fs.DurationVar(&a.window, "idempotency-window", 0, "with --acquirer sim: how long the simulator remembers a reference; a repeated capture after that moves money again (0: forever)")
	fs.DurationVar(&a.acceptance, "acceptance-window", acquirer.DefaultAcceptanceWindow, "with --acquirer sim or a simulator's URL: how long after it was sent a request may still land at the simulator (the remote one's own --acceptance-window); an operator's \"no\" on a reference it never saw waits this long unless the reference is fenced")
	a.registerStripe(fs)
}

// registerRemote registers the flags of a command that must reach the
// acquirer the charges were sent to: no simulator of its own.
func (a *acquirerFlags) registerRemote(fs *flag.FlagSet) {
	fs.StringVar(&a.target, "acquirer", "", "stripe, or the base `URL` of the acquirer the charges were sent to, such as a chargeonce acquirer")
	a.registerTimeout(fs)
	a.registerStripe(fs)
}

func (a *acquirerFlags) registerTimeout(fs *flag.FlagSet) {
	fs.DurationVar(&a.timeout, "acquirer-timeout", 2*time.Second, "how long one acquirer call may take before its outcome counts as unknown")
}

func (a *acquirerFlags) registerStripe(fs *flag.FlagSet) {
	fs.StringVar(&a.stripeKeyFile, "stripe-key-file", "", "with --acquirer stripe: a file holding the secret key (else $"+StripeKeyEnv+"); the key itself is never a flag")
	fs.StringVar(&a.stripeAPIBase, "stripe-api-base", "", "with --acquirer stripe: the API's base URL (tests: stripe-mock); empty for Stripe's")
	fs.DurationVar(&a.stripeSearchLag, "stripe-search-lag", stripe.DefaultSearchLag, "with --acquirer stripe: how long Stripe's search may lag behind a new PaymentIntent; a miss counts only for older references")
	fs.DurationVar(&a.stripeKeyWindow, "stripe-key-window", stripe.DefaultKeyWindow, "with --acquirer stripe: how long after a reference was first sent a re-send with its Idempotency-Key is taken to replay (Stripe keeps keys 24h)")
}

// stripeKey returns the secret key from --stripe-key-file or
// STRIPE_SECRET_KEY. Errors never contain the key.
func (a *acquirerFlags) stripeKey() (string, error) {
	if a.stripeKeyFile == "" {
		getenv := a.getenv
		if getenv == nil {
			getenv = os.Getenv
		}
		key := strings.TrimSpace(getenv(StripeKeyEnv))
		if key == "" {
			return "", fmt.Errorf("--acquirer stripe needs the secret key in $%s or a file named by --stripe-key-file", StripeKeyEnv)
		}
		return key, nil
	}
	if strings.HasPrefix(a.stripeKeyFile, "sk_") || strings.HasPrefix(a.stripeKeyFile, "rk_") {
		return "", fmt.Errorf("--stripe-key-file takes the path of a file holding the key, not the key: a key on the command line shows in ps and shell history; put it in a file or $%s", StripeKeyEnv)
	}
	b, err := os.ReadFile(a.stripeKeyFile)
	if err != nil {
		return "", fmt.Errorf("--stripe-key-file: %w", err)
	}
	key := strings.TrimSpace(string(b))
	if key == "" {
		return "", fmt.Errorf("--stripe-key-file: %s is empty", a.stripeKeyFile)
	}
	return key, nil
}

// build returns the acquirer, and the simulator when it is in-process.
func (a *acquirerFlags) build() (chargeonce.Acquirer, *acquirer.Simulator, error) {
	if a.timeout <= 0 {
		return nil, nil, fmt.Errorf("--acquirer-timeout must be positive")
	}
	if a.target == "sim" {
		opts := acquirer.Options{Latency: a.latency, Slow: a.slow, IdempotencyWindow: a.window, AcceptanceWindow: a.acceptance}
		if err := opts.Validate(); err != nil {
			return nil, nil, err
		}
		sim := acquirer.NewSimulator(opts)
		return sim, sim, nil
	}
	if a.target == "stripe" {
		key, err := a.stripeKey()
		if err != nil {
			return nil, nil, err
		}
		if a.stripeSearchLag <= 0 || a.stripeKeyWindow <= 0 {
			return nil, nil, fmt.Errorf("--stripe-search-lag and --stripe-key-window must be positive; got %s and %s", a.stripeSearchLag, a.stripeKeyWindow)
		}
		st, err := stripe.New(stripe.Options{Key: key, APIBase: a.stripeAPIBase, SearchLag: a.stripeSearchLag, KeyWindow: a.stripeKeyWindow,
			HTTPClient: &http.Client{Transport: a.tracing.Transport(&http.Transport{MaxIdleConnsPerHost: 256, IdleConnTimeout: 90 * time.Second})}})
		if err != nil {
			return nil, nil, err
		}
		return st, nil, nil
	}
	if !strings.HasPrefix(a.target, "http://") && !strings.HasPrefix(a.target, "https://") {
		return nil, nil, fmt.Errorf("--acquirer must be sim, stripe or an http(s):// URL; got %q", a.target)
	}
	return acquirer.NewClient(a.target, &http.Client{Transport: a.tracing.Transport(&http.Transport{
		MaxIdleConnsPerHost: 256,
		IdleConnTimeout:     90 * time.Second,
	})}), nil, nil
}

// finality is what acq promises about late requests (SPEC "Finality"),
// passed to the operators' resolution explicitly: the simulator's own
// window and fence in process, a remote simulator's fence with the window
// --acceptance-window states, Stripe's window.
func (a *acquirerFlags) finality(acq chargeonce.Acquirer) chargeonce.Finality {
	switch acq := acq.(type) {
	case *acquirer.Client:
		return acquirer.ClientFinality{Client: acq, Window: a.acceptance}
	case chargeonce.Finality:
		return acq
	}
	return nil
}

// DefaultLogFormat is --log-format's default: logfmt-like text for a
// person; json for a log pipeline.
const DefaultLogFormat = "text"

// newLogger returns the logger of --log-level and --log-format (text or
// json).
func newLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level must be debug, info, warn or error; got %q", level)
	}
	opts := &slog.HandlerOptions{Level: l}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		opts.ReplaceAttr = durationAsString
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format must be text or json; got %q", format)
}

// durationAsString writes a duration in a JSON log as the flags spell it
// ("30s"): slog's JSON handler would write nanoseconds (30000000000). The
// text handler already writes "30s".
func durationAsString(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		a.Value = slog.StringValue(a.Value.Duration().String())
	}
	return a
}

// isLoopback reports whether addr (host:port) only listens on loopback.
func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
