package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce/internal/apitest"
	"github.com/chargeonce/chargeonce/internal/pgtest"
)

func TestMain(m *testing.M) {
	pgtest.VerifyMain(m)
}

func TestBadConfigurationFailsAtStartNamingTheFlag(t *testing.T) {
	t.Parallel()
	db := "sqlite:" + filepath.Join(t.TempDir(), "c.db")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"serve", "--db", db, "--addr", "0.0.0.0:0"}, "--api-keys"},
		{[]string{"serve", "--db", "mysql://x"}, "--db"},
		{[]string{"serve", "--db", "sqlite:"}, "--db"},
		{[]string{"serve", "--db", db, "--lease", "1s", "--acquirer-timeout", "2s"}, "--lease"},
		{[]string{"serve", "--db", db, "--key-ttl", "-1s"}, "--key-ttl"},
		{[]string{"serve", "--db", db, "--admission-wait", "0s"}, "--admission-wait"},
		{[]string{"serve", "--db", db, "--merchant-rate", "fast"}, "--merchant-rate"},
		{[]string{"serve", "--db", db, "--merchant-rate", "0/s"}, "--merchant-rate"},
		{[]string{"serve", "--db", db, "--merchant-burst", "0"}, "--merchant-burst"},
		{[]string{"worker", "--db", db, "--merchant-rate", "10/d"}, "--merchant-rate"},
		{[]string{"serve", "--db", db, "--api-keys", "acme:sk_a,rate acme fast"}, "--api-keys"},
		{[]string{"serve", "--db", db, "--api-keys", "acme:sk_a,rate shop 10/s"}, "--api-keys"},
		{[]string{"serve", "--db", db, "--acquirer", "ftp://x"}, "--acquirer"},
		{[]string{"serve", "--db", db, "--idempotency-window", "-1s"}, "--idempotency-window"},
		{[]string{"acquirer", "--addr", "127.0.0.1:0", "--idempotency-window", "-1s"}, "--idempotency-window"},
		{[]string{"serve", "--db", db, "--api-keys", "nocolon"}, "--api-keys"},
		{[]string{"serve", "--db", db, "--log-level", "loud"}, "--log-level"},
		{[]string{"serve", "--db", db, "--addr", "127.0.0.1:notaport"}, "--addr"},
		{[]string{"serve", "extra"}, "unexpected argument"},
		{[]string{"frobnicate"}, "unknown command"},
	} {
		var out, errb apitest.Buffer
		err := Main(context.Background(), tc.args, &out, &errb)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want one naming %s", tc.args, err, tc.want)
		}
	}
}

func TestEnvironmentTwins(t *testing.T) {
	// t.Setenv forbids t.Parallel.
	t.Setenv("CHARGEONCE_LEASE", "soon")
	err := Main(context.Background(), []string{"serve", "--db", "sqlite:" + filepath.Join(t.TempDir(), "c.db")}, &apitest.Buffer{}, &apitest.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "CHARGEONCE_LEASE") || !strings.Contains(err.Error(), "--lease") {
		t.Fatalf("error %v, want one naming --lease and CHARGEONCE_LEASE", err)
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// TestServeOnEachStore runs the serve command itself, on the embedded SQLite
// default and on PostgreSQL, charges once, replays, and shuts down cleanly.
func TestServeOnEachStore(t *testing.T) {
	t.Parallel()
	for _, db := range []string{"sqlite", "postgres"} {
		t.Run(db, func(t *testing.T) {
			t.Parallel()
			dbURL := "sqlite:" + filepath.Join(t.TempDir(), "chargeonce.db")
			if db == "postgres" {
				dbURL = pgtest.URL(t)
			}
			addr := freeAddr(t)
			ctx, cancel := context.WithCancel(context.Background())
			var stderr apitest.Buffer
			done := make(chan error, 1)
			go func() {
				done <- Main(ctx, []string{"serve", "--db", dbURL, "--addr", addr, "--reconcile-every", "100ms"}, &apitest.Buffer{}, &stderr)
			}()
			base := "http://" + addr
			apitest.Eventually(t, 10*time.Second, "serve to answer /readyz", func() bool {
				resp, err := http.Get(base + "/readyz")
				if err != nil {
					return false
				}
				resp.Body.Close()
				return resp.StatusCode == 200
			})
			body := `{"order_id": 42, "amount_cents": 990, "payment_token": "tok_ok"}`
			first := apitest.Charge(t, base, "cmd-key", body)
			again := apitest.Charge(t, base, "cmd-key", body)
			if first.Status != 201 || again.Status != 201 || !bytes.Equal(first.Body, again.Body) || again.Header.Get("Idempotent-Replayed") != "true" {
				t.Fatalf("charge %d %s, replay %d %s", first.Status, first.Body, again.Status, again.Body)
			}
			stats, err := apitest.Do(t, nil, "GET", base+"/acquirer/v1/stats", nil, nil)
			if err != nil || !strings.Contains(string(stats.Body), `"captures":1`) {
				t.Fatalf("in-process acquirer stats: %v %s", err, stats.Body)
			}
			metrics, err := apitest.Do(t, nil, "GET", base+"/metrics", nil, nil)
			if err != nil || !strings.Contains(string(metrics.Body), `chargeonce_charge_attempts_total{replayed="true",status="201"} 1`) {
				t.Fatalf("metrics lack the replay: %v\n%s", err, metrics.Body)
			}
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("serve returned %v\n%s", err, stderr.String())
				}
			case <-time.After(15 * time.Second):
				t.Fatalf("serve did not stop")
			}
			if !strings.Contains(stderr.String(), "demo merchant") {
				t.Fatalf("serve did not say it runs with the demo key:\n%s", stderr.String())
			}
		})
	}
}

func TestMigrateAndReconcile(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	var out apitest.Buffer
	// Several migrations at once are safe (advisory lock).
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- Main(context.Background(), []string{"migrate", "--db", url}, &out, &apitest.Buffer{})
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("migrate: %v", err)
		}
	}
	// migrate says what it applied, and then that there is nothing to.
	fresh := pgtest.URL(t)
	for _, want := range []string{"applied 0001, 0002", "nothing to apply"} {
		var mout apitest.Buffer
		if err := Main(context.Background(), []string{"migrate", "--db", fresh}, &mout, &apitest.Buffer{}); err != nil || !strings.Contains(mout.String(), want) {
			t.Fatalf("migrate: %v, printed %q; want %q", err, mout.String(), want)
		}
	}
	var rout apitest.Buffer
	// reconcile refuses a simulator of its own: it must re-drive the
	// acquirer the charges were sent to.
	if err := Main(context.Background(), []string{"reconcile", "--db", url}, &rout, &apitest.Buffer{}); err == nil || !strings.Contains(err.Error(), "--acquirer") {
		t.Fatalf("reconcile with the default in-process simulator: %v, want an error naming --acquirer", err)
	}
	// With nothing to recover, no acquirer is called.
	if err := Main(context.Background(), []string{"reconcile", "--db", url, "--acquirer", "http://127.0.0.1:1"}, &rout, &apitest.Buffer{}); err != nil {
		t.Fatalf("reconcile: %v", err)
	}
	if !strings.HasPrefix(rout.String(), "claimed=0 settled=0 deferred=0 stuck=0") {
		t.Fatalf("reconcile printed %q", rout.String())
	}
}

// No command is a usage error: the usage on stderr and exit status 2. One
// that does not exist says so and where the list is (exit 2). Asking for
// help is not an error.
func TestUsage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args     []string
		wantErr  error
		wantText string
	}{
		{nil, exitCodeError(2), "usage: chargeonce <command>"},
		{[]string{"charg"}, usageError("unknown command \"charg\"\nRun 'chargeonce help' for the commands."), ""},
		{[]string{"help"}, nil, "usage: chargeonce <command>"},
	} {
		out, errOut, err := runMain(t, tc.args...)
		if err != tc.wantErr { //nolint:errorlint // exitCodeError is compared as a value
			t.Errorf("chargeonce %v: error %v; want %v", tc.args, err, tc.wantErr)
		}
		if !strings.Contains(out+errOut, tc.wantText) {
			t.Errorf("chargeonce %v printed %q; want %q", tc.args, out+errOut, tc.wantText)
		}
	}
}

// A failed command's last line says chargeonce once, though the client's
// errors name their package too.
func TestErrorLineSaysChargeonceOnce(t *testing.T) {
	t.Parallel()
	for _, err := range []error{errors.New("chargeonce: 400 invalid-request: amount"), errors.New("--db: no such file")} {
		if got := errorLine(err); strings.Count(got, "chargeonce:") != 1 {
			t.Errorf("errorLine(%q) = %q; want one chargeonce: prefix", err, got)
		}
	}
}

// Each command's help lists its own flags, each with the environment
// variable that really sets it; reconcile, which must reach the acquirer the
// charges were sent to, offers no simulator.
func TestHelpListsOwnFlagsWithTheirTwins(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cmd           string
		want, notWant []string
	}{
		{"serve", []string{"-key-ttl duration", "env CHARGEONCE_KEY_TTL"}, nil},
		{"charge", []string{"env CHARGEONCE_AMOUNT", "no environment twin"}, []string{"KEY_TTL", "key-ttl"}},
		{"reconcile", []string{"-acquirer URL", "env CHARGEONCE_ACQUIRER_TIMEOUT"}, []string{"-slow", "-latency", "-idempotency-window", "sim"}},
	} {
		_, errOut, err := runMain(t, tc.cmd, "-h")
		if !errors.Is(err, flag.ErrHelp) {
			t.Fatalf("%s -h: error %v", tc.cmd, err)
		}
		for _, w := range tc.want {
			if !strings.Contains(errOut, w) {
				t.Errorf("%s -h lacks %q:\n%s", tc.cmd, w, errOut)
			}
		}
		for _, nw := range tc.notWant {
			if strings.Contains(errOut, nw) {
				t.Errorf("%s -h mentions %q:\n%s", tc.cmd, nw, errOut)
			}
		}
	}
}
