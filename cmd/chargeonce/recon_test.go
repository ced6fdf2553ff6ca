package main

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/idempotency"
	"github.com/chargeonce/chargeonce/internal/apitest"
	"github.com/chargeonce/chargeonce/recon"
	"github.com/chargeonce/chargeonce/sqlite"
)

// `chargeonce recon` against a stand-alone acquirer: a clean day, stored as
// one run; the same day again after a capture the database does not know,
// the same run updated, the capture reported, exit status 3.
func TestReconCommand(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "chargeonce.db")
	store, err := sqlite.Open(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	sim := apitest.Simulator(t, acquirer.Options{})
	srv := httptest.NewServer(acquirer.Handler(sim))
	t.Cleanup(srv.Close)
	eng := engine.New(store, sim, engine.Options{Lease: 5 * time.Second, AcquirerTimeout: time.Second})
	for i := range 6 {
		req := &chargeonce.ChargeRequest{OrderID: int64(i + 1), AmountCents: 1000, PaymentToken: acquirer.TokenOK}
		if err := req.Normalize(); err != nil {
			t.Fatal(err)
		}
		if _, err := eng.Charge(t.Context(), "demo", "k"+string(rune('a'+i)), req); err != nil {
			t.Fatal(err)
		}
	}
	store.Close()

	now := time.Now().UTC()
	args := []string{"recon", "--db", "sqlite:" + path, "--acquirer", srv.URL + "/",
		"--from", now.Add(-time.Hour).Format(time.RFC3339Nano), "--to", now.Add(time.Hour).Format(time.RFC3339Nano)}
	var out, errOut apitest.Buffer
	if err := Main(context.Background(), args, &out, &errOut); err != nil {
		t.Fatalf("recon on a clean day: %v\n%s", err, errOut.String())
	}
	var rep recon.Report
	if err := json.Unmarshal([]byte(out.String()), &rep); err != nil {
		t.Fatalf("the JSON report does not parse: %v\n%s", err, out.String())
	}
	if !rep.Clean || rep.Charges != 6 || rep.Matched != 6 || rep.Acquirer != srv.URL {
		t.Fatalf("clean day: clean=%v charges=%d matched=%d acquirer=%q\n%s", rep.Clean, rep.Charges, rep.Matched, rep.Acquirer, out.String())
	}

	ghost := idempotency.NewChargeID()
	if _, err := sim.Capture(t.Context(), chargeonce.CaptureRequest{Reference: ghost, OrderID: 9, Merchant: "demo", AmountCents: 1000, Currency: "BRL", PaymentToken: "tok_ok"}); err != nil {
		t.Fatal(err)
	}
	var csvOut, errOut2 apitest.Buffer
	metrics := filepath.Join(t.TempDir(), "recon.prom")
	err = Main(context.Background(), append(args, "--format", "csv", "--metrics-file", metrics), &csvOut, &errOut2)
	if ec, ok := errors.AsType[exitCodeError](err); !ok || int(ec) != ReconMismatchExit {
		t.Fatalf("recon with a capture we do not know: %v, want exit status %d\n%s", err, ReconMismatchExit, errOut2.String())
	}
	rows, err := csv.NewReader(strings.NewReader(csvOut.String())).ReadAll()
	if err != nil || len(rows) != 2 || rows[1][0] != string(recon.MissingInternal) || rows[1][1] != ghost {
		t.Fatalf("CSV %q (%v), want one missing_internal row for %s", rows, err, ghost)
	}
	prom, err := os.ReadFile(metrics)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{
		`chargeonce_recon_mismatches{acquirer="` + srv.URL + `",type="missing_internal"} 1`,
		`chargeonce_recon_mismatches{acquirer="` + srv.URL + `",type="amount_mismatch"} 0`,
		`chargeonce_recon_matched{acquirer="` + srv.URL + `"} 6`,
	} {
		if !strings.Contains(string(prom), line+"\n") {
			t.Errorf("the metrics file has no line %q:\n%s", line, prom)
		}
	}
	if !strings.Contains(errOut2.String(), "run 2 of this period") {
		t.Fatalf("the re-run is not the same stored run: %s", errOut2.String())
	}
}

func TestReconCommandRefusesBadFlags(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"recon", "--acquirer", "http://127.0.0.1:1"},
		{"recon", "--acquirer", "http://127.0.0.1:1", "--day", "2026-13-01"},
		{"recon", "--acquirer", "http://127.0.0.1:1", "--day", "2026-12-01", "--from", "2026-12-01T00:00:00Z"},
		{"recon", "--acquirer", "sim", "--day", "2026-12-01"},
		{"recon", "--day", "2026-12-01"},
		{"recon", "--acquirer", "http://127.0.0.1:1", "--day", "2026-12-01", "--format", "xml"},
		{"recon", "--acquirer", "http://127.0.0.1:1", "--day", "2026-12-01", "--lookahead", "0s"},
	} {
		err := Main(context.Background(), args, &apitest.Buffer{}, &apitest.Buffer{})
		if _, ok := errors.AsType[usageError](err); !ok {
			t.Errorf("%q: %v, want a usage error", args, err)
		}
	}
}

// `chargeonce recon --acquirer stripe` needs the secret key as serve does,
// and says so before it opens anything.
func TestReconStripeNeedsKey(t *testing.T) {
	t.Parallel()
	var out, errOut apitest.Buffer
	err := Main(context.Background(), []string{"recon", "--db", "sqlite:" + filepath.Join(t.TempDir(), "x.db"), "--acquirer", "stripe",
		"--stripe-key-file", filepath.Join(t.TempDir(), "missing"), "--day", "2026-12-06"}, &out, &errOut)
	if err == nil || !strings.Contains(err.Error(), "--stripe-key-file") {
		t.Fatalf("recon --acquirer stripe without a key: %v, want an error naming --stripe-key-file", err)
	}
}
