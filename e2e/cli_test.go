package e2e

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce/internal/apitest"
	"github.com/chargeonce/chargeonce/internal/natstest"
	"github.com/chargeonce/chargeonce/internal/pgtest"
)

// run runs the built binary with args and returns its output and exit
// status. Its environment carries no CHARGEONCE_* variable.
func run(t *testing.T, args ...string) (stdout, stderr string, status int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary(t), args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	for _, kv := range cmd.Environ() {
		if !strings.HasPrefix(kv, "CHARGEONCE_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exit):
		status = exit.ExitCode()
	default:
		t.Fatalf("running chargeonce %v: %v", args, err)
	}
	return out.String(), errb.String(), status
}

// TestCLIAgainstTheBuiltBinary checks, on the binary a user runs, that the
// command line does not surprise: usage and exit statuses, each command's
// own flags, what migrate did, errors that say what is wrong, once
// prefixed, and no panic.
func TestCLIAgainstTheBuiltBinary(t *testing.T) {
	t.Parallel()
	// Every error line says "chargeonce: " once.
	noDoublePrefix := func(t *testing.T, out string) {
		t.Helper()
		if strings.Contains(out, "chargeonce: chargeonce:") {
			t.Errorf("a doubled prefix:\n%s", out)
		}
		if strings.Contains(out, "panic") || strings.Contains(out, "goroutine ") {
			t.Errorf("a panic:\n%s", out)
		}
	}

	t.Run("no arguments: usage, exit 2", func(t *testing.T) {
		t.Parallel()
		_, stderr, status := run(t)
		if status != 2 || !strings.Contains(stderr, "usage: chargeonce <command>") || !strings.Contains(stderr, "serve") {
			t.Errorf("exit %d, stderr:\n%s", status, stderr)
		}
		_, stderr, status = run(t, "frobnicate")
		if status != 2 || !strings.Contains(stderr, `chargeonce: unknown command "frobnicate"`) {
			t.Errorf("unknown command: exit %d, stderr:\n%s", status, stderr)
		}
		noDoublePrefix(t, stderr)
	})

	t.Run("a bad flag: the error and where help is, exit 2; --version and -v", func(t *testing.T) {
		t.Parallel()
		_, stderr, status := run(t, "serve", "--no-such-flag")
		if status != 2 || stderr != "chargeonce: flag provided but not defined: -no-such-flag\nRun 'chargeonce serve -h' for its flags.\n" {
			t.Errorf("exit %d, stderr:\n%s", status, stderr)
		}
		for _, spelling := range []string{"version", "--version", "-v"} {
			stdout, stderr, status := run(t, spelling)
			if status != 0 || !strings.HasPrefix(stdout, "version ") {
				t.Errorf("chargeonce %s: exit %d\n%s%s", spelling, status, stdout, stderr)
			}
		}
	})

	t.Run("help lists the command's own flags and their twins", func(t *testing.T) {
		t.Parallel()
		_, stderr, status := run(t, "reconcile", "--help")
		if status != 0 {
			t.Errorf("reconcile --help: exit %d", status)
		}
		for _, want := range []string{"-db", "env CHARGEONCE_DB", "-acquirer URL", "env CHARGEONCE_ACQUIRER", "-lease"} {
			if !strings.Contains(stderr, want) {
				t.Errorf("reconcile --help lacks %q:\n%s", want, stderr)
			}
		}
		for _, simulator := range []string{"-slow", "-latency", "-idempotency-window", "-addr", "-nats"} {
			if regexp.MustCompile(`(?m)^\s+` + simulator + `\b`).MatchString(stderr) {
				t.Errorf("reconcile --help lists %s, not one of its flags:\n%s", simulator, stderr)
			}
		}
		_, stderr, _ = run(t, "migrate", "-h")
		if strings.Count(stderr, "\n  -") != 1 || !strings.Contains(stderr, "env CHARGEONCE_DB") {
			t.Errorf("migrate -h should list --db alone:\n%s", stderr)
		}
	})

	t.Run("migrate says what it applied", func(t *testing.T) {
		t.Parallel()
		db := "sqlite:" + filepath.Join(t.TempDir(), "m.db")
		stdout, stderr, status := run(t, "migrate", "--db", db)
		if status != 0 || !regexp.MustCompile(`^applied 0001, .* on sqlite:.*: schema version \d+\n$`).MatchString(stdout) {
			t.Errorf("first migrate: exit %d\n%s%s", status, stdout, stderr)
		}
		stdout, _, status = run(t, "migrate", "--db", db)
		if status != 0 || !strings.Contains(stdout, "nothing to apply") {
			t.Errorf("second migrate: exit %d\n%s", status, stdout)
		}
	})

	t.Run("an sqlite path that cannot be opened says so", func(t *testing.T) {
		t.Parallel()
		_, stderr, status := run(t, "migrate", "--db", "sqlite:"+filepath.Join(t.TempDir(), "no", "such", "dir", "c.db"))
		if status != 1 || !strings.Contains(stderr, "chargeonce: --db: opening sqlite database") || strings.Contains(stderr, "Idempotency-Key") {
			t.Errorf("exit %d, stderr:\n%s", status, stderr)
		}
		noDoublePrefix(t, stderr)
	})

	t.Run("race on a missing database", func(t *testing.T) {
		t.Parallel()
		missing := withDatabase(t, pgtest.AdminURL(t), "chargeonce_no_such_db")
		_, stderr, status := run(t, "race", "--db", missing, "--intents", "2", "--svg", filepath.Join(t.TempDir(), "r.svg"))
		if status != 1 || !strings.Contains(stderr, `database "chargeonce_no_such_db" does not exist`) {
			t.Errorf("exit %d, stderr:\n%s", status, stderr)
		}
		noDoublePrefix(t, stderr)
	})

	t.Run("worker against a NATS without JetStream", func(t *testing.T) {
		t.Parallel()
		ns := natstest.StartWithoutJetStream(t)
		_, stderr, status := run(t, "worker", "--nats", ns.URL, "--db", "sqlite:"+filepath.Join(t.TempDir(), "w.db"))
		if status != 1 || !strings.Contains(stderr, "does not have JetStream enabled: start nats-server with -js") {
			t.Errorf("exit %d, stderr:\n%s", status, stderr)
		}
		noDoublePrefix(t, stderr)
	})
}

// withDatabase returns the admin URL with its database replaced by name.
func withDatabase(t *testing.T, admin, name string) string {
	t.Helper()
	re := regexp.MustCompile(`^(postgres(?:ql)?://[^/]*/)[^?]*`)
	if !re.MatchString(admin) {
		t.Fatalf("cannot name a database in %s", admin)
	}
	return re.ReplaceAllString(admin, "${1}"+name)
}

// TestDebugLogsTheEngineDecisions: serve at --log-level debug logs, for
// every attempt, what the engine decided.
func TestDebugLogsTheEngineDecisions(t *testing.T) {
	t.Parallel()
	ps := newProcs(t)
	acq := ps.startAcquirer("acquirer")
	srv := ps.start("serve", serveArgs("sqlite:"+filepath.Join(t.TempDir(), "c.db"), acq.URL(), "--log-level", "debug")...)
	body := chargeBody(newOrder(), "tok_ok")
	key := "debug-" + uniqueName("k")
	for range 2 { // a new intent, then its replay
		if a := charge(&http.Client{Timeout: 10 * time.Second}, srv.URL(), key, body); a.status != 201 {
			t.Fatalf("charge: %s", a)
		}
	}
	apitest.Eventually(t, 10*time.Second, "the engine's decisions in the log", func() bool {
		log := srv.logText()
		return regexp.MustCompile(`level=DEBUG msg="charge attempt" decision="[^"]+" merchant=demo key_hash=[0-9a-f]{12} charge_id=\S+ status=201`).MatchString(log) &&
			strings.Count(log, `msg="charge attempt"`) >= 2
	})
	decisions := regexp.MustCompile(`msg="charge attempt" decision="([^"]+)"`).FindAllStringSubmatch(srv.logText(), -1)
	var got []string
	for _, d := range decisions {
		got = append(got, d[1])
	}
	t.Logf("decisions: %v", got)
	if len(got) != 2 || got[0] == got[1] {
		t.Errorf("want two decisions, a new key's and its replay's, that differ; got %v", got)
	}
}
