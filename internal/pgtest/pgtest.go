// Package pgtest gives tests a PostgreSQL database of their own.
//
// Every test that calls URL gets a fresh, empty schema on a shared server and
// a connection URL whose search_path points at it, so tests can run in
// parallel without ever seeing each other's rows, and the schema is dropped
// when the test ends.
//
// The server is found in this order:
//
//  1. TEST_DATABASE_URL, when set (what CI and developers with a running
//     PostgreSQL use), for example
//     postgres://postgres@127.0.0.1:5432/test?sslmode=disable;
//  2. otherwise a throwaway cluster, started once per test binary: initdb into
//     a temporary directory with the server binaries found through
//     `pg_config --bindir` or /usr/lib/postgresql/*/bin, listening on a free
//     loopback port. When the tests run as root (as in CI containers), the
//     cluster runs as the "postgres" OS user, because PostgreSQL refuses to
//     run as root.
//
// When neither works the test fails with a message that says how to provide
// a server. It never skips: a skipped database test is a test that silently
// stopped protecting the code.
//
// A package that uses pgtest stops the throwaway cluster from its TestMain:
//
//	func TestMain(m *testing.M) { goleak.VerifyTestMain(pgtest.M(m)) }
//
// or, without goleak, pgtest.Main(m).
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// EnvURL names the environment variable that points the tests at an existing
// PostgreSQL server instead of a throwaway cluster.
const EnvURL = "TEST_DATABASE_URL"

// adminTimeout bounds each administrative statement pgtest runs (creating or
// dropping a schema), so a wedged server fails the test instead of hanging it.
const adminTimeout = 30 * time.Second

var (
	cluster   *throwaway // nil unless this process started one
	clusterMu sync.Mutex
)

// server returns the base URL of the server this test binary uses, starting
// the throwaway cluster on first use when TEST_DATABASE_URL is unset.
var server = sync.OnceValues(func() (string, error) {
	if u := os.Getenv(EnvURL); u != "" {
		return u, nil
	}
	// The cluster serves every test of the binary and is stopped by Stop,
	// not by any test's context.
	c, err := startThrowaway(context.Background())
	if err != nil {
		return "", fmt.Errorf("%w\n\n%s", err, howToProvide)
	}
	clusterMu.Lock()
	cluster = c
	clusterMu.Unlock()
	return c.url, nil
})

const howToProvide = `pgtest needs a PostgreSQL server. Either
  - set TEST_DATABASE_URL, for example
      TEST_DATABASE_URL='postgres://postgres@127.0.0.1:5432/test?sslmode=disable'
    (the role must be allowed to CREATE SCHEMA in that database), or
  - install the PostgreSQL server binaries (initdb, postgres; e.g. apt-get
    install postgresql) so pgtest can start a throwaway cluster; it finds them
    with pg_config --bindir or in /usr/lib/postgresql/*/bin.`

// hint says how to fix a server that was found but does not work.
func hint() string {
	if os.Getenv(EnvURL) != "" {
		return "The server comes from " + EnvURL + ": check that it is running and that its role may CREATE SCHEMA,\nor unset " + EnvURL + " to let pgtest start a throwaway cluster."
	}
	return "The throwaway cluster stopped working; its log is in its directory under " + os.TempDir() + "."
}

// AdminURL returns the base URL of the test server, without a per-test
// search_path, for tests that need to act on the server as a whole (for
// example pg_terminate_backend on a store's connections). It starts the
// throwaway cluster if needed and fails the test when no server is available.
func AdminURL(t testing.TB) string {
	t.Helper()
	u, err := server()
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	return u
}

// URL returns a connection URL for a fresh, empty schema that belongs to t
// alone: the schema t_<random> is created on the test server and the URL
// carries search_path=t_<random>, which pgx sends as a runtime parameter, so
// every unqualified table a store creates or queries lands in it. The schema
// and everything in it are dropped in t.Cleanup; cleanups registered after
// URL returns (such as closing a store) run before the drop.
func URL(t testing.TB) string {
	t.Helper()
	base := AdminURL(t)

	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatalf("pgtest: generating schema name: %v", err)
	}
	schema := "t_" + hex.EncodeToString(b[:])

	if err := execAdmin(base, "CREATE SCHEMA "+schema); err != nil {
		t.Fatalf("pgtest: creating schema %s on %s: %v\n\n%s", schema, redact(base), err, hint())
	}
	t.Cleanup(func() {
		if err := execAdmin(base, "DROP SCHEMA IF EXISTS "+schema+" CASCADE"); err != nil {
			t.Errorf("pgtest: dropping schema %s: %v", schema, err)
		}
	})

	u, err := withSearchPath(base, schema)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	return u
}

// withSearchPath returns base with its search_path query parameter set to
// schema.
func withSearchPath(base, schema string) (string, error) {
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return "", fmt.Errorf("%s must be a postgres:// URL, got %q", EnvURL, redact(base))
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// execAdmin runs one statement on its own short-lived connection. pgtest keeps no
// pool of its own, so it leaves no goroutines behind for goleak to report.
func execAdmin(connURL, sql string) error {
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, connURL)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, sql)
	return err
}

// redact hides the password in a connection URL before it goes into a test
// log.
func redact(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}

// Stop stops the throwaway cluster, if this process started one, and removes
// its directory. It is safe to call more than once and does nothing when the
// tests use TEST_DATABASE_URL. M and Main call it; call it yourself only from
// a TestMain that uses neither.
func Stop() {
	clusterMu.Lock()
	c := cluster
	cluster = nil
	clusterMu.Unlock()
	if c != nil {
		if err := c.stop(); err != nil {
			fmt.Fprintf(os.Stderr, "pgtest: stopping throwaway cluster: %v\n", err)
		}
	}
}

// TestingM is the part of *testing.M that goleak.VerifyTestMain needs.
type TestingM interface {
	Run() int
}

type stopAfter struct{ m TestingM }

func (s stopAfter) Run() int {
	defer Stop()
	return s.m.Run()
}

// M wraps m so that running it also stops the throwaway cluster once the
// tests are done, before a goroutine-leak check looks for leftovers:
//
//	func TestMain(m *testing.M) { goleak.VerifyTestMain(pgtest.M(m)) }
func M(m TestingM) TestingM { return stopAfter{m} }

// Main runs the tests, stops the throwaway cluster and exits with the tests'
// status. Use it as the whole body of TestMain in packages without a leak
// check.
func Main(m *testing.M) { os.Exit(M(m).Run()) }
