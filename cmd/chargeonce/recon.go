package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/acquirer/stripe"
	"github.com/chargeonce/chargeonce/recon"
)

// ReconMismatchExit is recon's exit status when the report names a
// mismatch other than pending: the run worked, and the books disagree.
const ReconMismatchExit = 3

// runRecon reconciles a day (or a range) of our charges with the acquirer's
// ledger, stores the run under (acquirer, period), and prints the report.
func runRecon(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var (
		db, day, fromS, toS, format string
		metricsFile                 string
		margin, window, lookahead   time.Duration
		page                        int
	)
	var opts0 recon.Options
	fs := newFlagSet("recon", stderr)
	fs.StringVar(&db, "db", DefaultDB, "database: postgres://… or sqlite:PATH")
	acqTarget := fs.String("acquirer", "", "stripe, or the base `URL` of the acquirer the charges were sent to: a chargeonce acquirer, or serve's in-process simulator at http://ADDR/acquirer")
	var sf acquirerFlags
	sf.registerStripe(fs)
	fs.StringVar(&day, "day", "", "the UTC day to reconcile, `YYYY-MM-DD`")
	fs.StringVar(&fromS, "from", "", "with --to instead of --day: the start of the period, RFC 3339")
	fs.StringVar(&toS, "to", "", "with --from: the end of the period (excluded), RFC 3339")
	fs.StringVar(&format, "format", "json", "the report's format on stdout: json or csv (mismatches only)")
	fs.DurationVar(&margin, "margin", recon.DefaultMargin, "how far past both ends of the period both sides are read, so a charge near midnight joins its capture")
	fs.DurationVar(&window, "settlement-window", recon.DefaultSettlementWindow, "a charge younger than this that the acquirer does not show yet (or that is still processing) is pending, not a mismatch")
	fs.DurationVar(&lookahead, "lookahead", recon.DefaultLookahead, "what we recorded in the period as money moved that the acquirer's ledger does not show within the period and margin is looked up in its ledger for this long after them before it is missing_at_acquirer (an acquirer that settles late)")
	fs.IntVar(&page, "page-size", chargeonce.ReconDefaultPage, fmt.Sprintf("rows read per page on each side (1 to %d)", chargeonce.ReconMaxPage))
	fs.BoolVar(&opts0.TimeOrderedIDs, "time-ordered-ids", true, "charge ids begin with their creation time (as chargeonce makes them): read only the period's stretch of ids; false walks every id, for ids made otherwise")
	fs.StringVar(&metricsFile, "metrics-file", "", "also write the run's counts to this `file` in Prometheus text format (node_exporter's textfile collector), replaced atomically")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	opts := opts0
	opts.Margin, opts.SettlementWindow, opts.PageSize, opts.Lookahead = margin, window, page, lookahead
	if err := reconPeriod(&opts, day, fromS, toS); err != nil {
		return err
	}
	if format != "json" && format != "csv" {
		return usageError(fmt.Sprintf("--format must be json or csv; got %q", format))
	}
	if margin < 0 || window < 0 {
		return usageError("--margin and --settlement-window must not be negative")
	}
	if lookahead <= 0 {
		return usageError("--lookahead must be positive")
	}
	if page < 1 || page > chargeonce.ReconMaxPage {
		return usageError(fmt.Sprintf("--page-size must be 1 to %d; got %d", chargeonce.ReconMaxPage, page))
	}
	ledger, name, err := reconLedger(*acqTarget, &sf)
	if err != nil {
		return err
	}
	if c, ok := ledger.(io.Closer); ok {
		defer c.Close()
	}
	opts.Acquirer = name

	store, err := storeFor(ctx, db)
	if err != nil {
		return err
	}
	defer store.Close()
	rs, ok := store.(chargeonce.ReconStore)
	if !ok {
		return fmt.Errorf("--db: the %T store cannot be reconciled", store)
	}
	rep, err := recon.Run(ctx, rs, ledger, opts)
	if err != nil {
		return err
	}
	run, err := recon.Save(ctx, rs, rep)
	if err != nil {
		return err
	}
	if metricsFile != "" {
		if err := writeMetricsFile(metricsFile, rep); err != nil {
			return err
		}
	}
	if format == "csv" {
		err = rep.WriteCSV(stdout)
	} else {
		err = rep.WriteJSON(stdout)
	}
	if err != nil {
		return err
	}
	var summary []string
	for _, t := range recon.Types {
		if n := rep.Counts[t]; n > 0 {
			summary = append(summary, fmt.Sprintf("%s=%d", t, n))
		}
	}
	fmt.Fprintf(stderr, "recon: %s %s: charges=%d ledger_entries=%d matched=%d mismatches=%d %s (run %d of this period)\n",
		run.Acquirer, run.Period, rep.Charges, rep.LedgerEntries, rep.Matched, len(rep.Mismatches), strings.Join(summary, " "), run.Runs)
	if len(rep.Mismatches) > rep.Counts[recon.Pending] {
		return exitCodeError(ReconMismatchExit)
	}
	return nil
}

// reconPeriod sets the period of opts from --day or --from and --to.
func reconPeriod(opts *recon.Options, day, from, to string) error {
	switch {
	case day != "" && (from != "" || to != ""):
		return usageError("recon takes --day or --from and --to, not both")
	case day != "":
		d, err := time.Parse(time.DateOnly, day)
		if err != nil {
			return usageError(fmt.Sprintf("--day must be YYYY-MM-DD; got %q", day))
		}
		opts.Period, opts.From, opts.To = d.Format(time.DateOnly), d, d.AddDate(0, 0, 1)
		return nil
	case from != "" && to != "":
		f, err := time.Parse(time.RFC3339Nano, from)
		if err != nil {
			return usageError(fmt.Sprintf("--from must be an RFC 3339 time; got %q", from))
		}
		t, err := time.Parse(time.RFC3339Nano, to)
		if err != nil {
			return usageError(fmt.Sprintf("--to must be an RFC 3339 time; got %q", to))
		}
		if !f.Before(t) {
			return usageError("--from must be before --to")
		}
		f, t = f.UTC(), t.UTC()
		opts.Period, opts.From, opts.To = f.Format(time.RFC3339Nano)+"/"+t.Format(time.RFC3339Nano), f, t
		return nil
	}
	return usageError("recon needs --day YYYY-MM-DD, or --from and --to")
}

// reconLedger returns the ledger of --acquirer and the name its runs are
// stored under: the URL without credentials, query or trailing slash.
func reconLedger(target string, sf *acquirerFlags) (chargeonce.Ledger, string, error) {
	switch target {
	case "":
		return nil, "", usageError("--acquirer: recon needs the URL of the acquirer the charges were sent to (such as a `chargeonce acquirer`, or serve's in-process simulator at http://ADDR/acquirer)")
	case "sim":
		return nil, "", usageError("--acquirer sim: a simulator made up by recon has never seen the charges; name the URL of the one they were sent to (serve's in-process simulator is at http://ADDR/acquirer)")
	case "stripe":
		// Stripe's PaymentIntents and Refunds created in the period, sorted
		// by reference through temporary files (stripe.Ledger).
		key, err := sf.stripeKey()
		if err != nil {
			return nil, "", err
		}
		st, err := stripe.New(stripe.Options{Key: key, APIBase: sf.stripeAPIBase, HTTPClient: &http.Client{Timeout: time.Minute}})
		if err != nil {
			return nil, "", err
		}
		return st.Ledger(stripe.LedgerOptions{}), "stripe", nil
	}
	u, err := url.Parse(target)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, "", usageError(fmt.Sprintf("--acquirer must be an http(s):// URL; got %q", target))
	}
	ledger, name := reconClient(target), u.Scheme+"://"+u.Host+strings.TrimSuffix(u.Path, "/")
	return ledger, name, nil
}

func reconClient(base string) chargeonce.Ledger {
	return acquirer.NewClient(base, &http.Client{Timeout: 30 * time.Second})
}

// writeMetricsFile writes rep's metrics next to path and renames them over
// it, so the collector never reads half a file.
func writeMetricsFile(path string, rep *recon.Report) error {
	f, err := os.CreateTemp(filepath.Dir(path), ".recon-metrics-*")
	if err != nil {
		return fmt.Errorf("--metrics-file: %w", err)
	}
	defer os.Remove(f.Name())
	if err := rep.WriteMetrics(f); err != nil {
		f.Close()
		return fmt.Errorf("--metrics-file: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("--metrics-file: %w", err)
	}
	// node_exporter runs as another user and must read it; counts are no secret.
	if err := os.Chmod(f.Name(), 0o644); err != nil { //nolint:gosec // G302: see above
		return fmt.Errorf("--metrics-file: %w", err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("--metrics-file: %w", err)
	}
	return nil
}
