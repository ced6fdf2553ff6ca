package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// pgbouncerDB is the database name PgBouncer serves the target under.
const pgbouncerDB = "pooled"

// identifier is what PgBouncer's connect_query may name as a schema without
// quoting: pgtest's own schemas (t_<hex>) and the bench's.
var identifier = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)

// PgBouncer starts a real PgBouncer (Debian's /usr/sbin/pgbouncer, or the
// one on PATH) in transaction mode in front of the server target points at,
// and returns a URL to it. It is stopped in t.Cleanup.
//
// The pooler is configured as operators run it, with no concession to
// chargeonce: pool_mode=transaction, no ignore_startup_parameters, no
// prepared-statement support (1.18 has none). So a client that sends a
// runtime parameter in its startup packet, or relies on session state or
// named prepared statements, fails through it as it would in production.
//
// target's search_path (pgtest.URL's per-test schema) cannot travel in the
// startup packet through PgBouncer; it becomes the pool's connect_query,
// which every server connection runs once, so the returned URL reaches the
// same schema. Other runtime parameters in target are refused.
//
// When the tests run as root, PgBouncer runs as the "postgres" OS user, as
// the throwaway cluster does. The test fails loudly when PgBouncer is not
// installed or does not start: install it with apt-get install pgbouncer.
func PgBouncer(t testing.TB, target string) string {
	t.Helper()
	cfg, err := pgconn.ParseConfig(target)
	if err != nil {
		t.Fatalf("pgtest.PgBouncer: parsing %s: %v", redact(target), err)
	}
	var connectQuery string
	for k, v := range cfg.RuntimeParams {
		switch {
		case k == "search_path" && identifier.MatchString(v):
			connectQuery = "SET search_path TO " + v
		case k == "search_path":
			t.Fatalf("pgtest.PgBouncer: search_path %q is not a plain identifier", v)
		default:
			t.Fatalf("pgtest.PgBouncer: runtime parameter %s in %s: PgBouncer would refuse it", k, redact(target))
		}
	}
	return startPgBouncer(t, cfg, connectQuery, false)
}

// PgBouncerServer starts a real PgBouncer in transaction mode, configured
// as PgBouncer does, in front of the server target points at, serving every database of
// that server under its own name (a `* =` entry), and returns a URL to it
// naming target's database. target must carry no runtime parameter. It is
// stopped in t.Cleanup; the test fails loudly when PgBouncer cannot start.
func PgBouncerServer(t testing.TB, target string) string {
	t.Helper()
	cfg, err := pgconn.ParseConfig(target)
	if err != nil {
		t.Fatalf("pgtest.PgBouncerServer: parsing %s: %v", redact(target), err)
	}
	for k := range cfg.RuntimeParams {
		t.Fatalf("pgtest.PgBouncerServer: runtime parameter %s in %s: PgBouncer would refuse it", k, redact(target))
	}
	return startPgBouncer(t, cfg, "", true)
}

func startPgBouncer(t testing.TB, cfg *pgconn.Config, connectQuery string, anyDB bool) string {
	t.Helper()
	bin, err := pgbouncerBinary()
	if err != nil {
		t.Fatalf("pgtest.PgBouncer: %v", err)
	}
	own, err := clusterOwner()
	if err != nil {
		t.Fatalf("pgtest.PgBouncer: %v", err)
	}
	dir, err := os.MkdirTemp("", "pgtest-pgbouncer-")
	if err != nil {
		t.Fatalf("pgtest.PgBouncer: %v", err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if own != nil {
		if err := os.Chown(dir, int(own.uid), int(own.gid)); err != nil {
			t.Fatalf("pgtest.PgBouncer: handing %s to %s: %v", dir, own.name, err)
		}
	}
	var errs []error
	for range launchAttempts {
		b, err := launchPgBouncer(own, bin, dir, cfg, connectQuery, anyDB)
		if err == nil {
			t.Cleanup(b.stop)
			return b.url
		}
		errs = append(errs, err)
	}
	t.Fatalf("pgtest.PgBouncer: %s%s did not start: %v", bin, asUser(own), errors.Join(errs...))
	return ""
}

// pgbouncerBinary finds the pgbouncer executable.
func pgbouncerBinary() (string, error) {
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p, nil
	}
	const debian = "/usr/sbin/pgbouncer"
	if fi, err := os.Stat(debian); err == nil && !fi.IsDir() {
		return debian, nil
	}
	return "", errors.New("no pgbouncer on PATH or at /usr/sbin/pgbouncer; install it (apt-get install pgbouncer)")
}

type bouncer struct {
	url  string
	cmd  *exec.Cmd
	done chan struct{}
}

// launchPgBouncer writes a configuration for a free port, starts PgBouncer
// and waits until a query goes through it.
func launchPgBouncer(own *owner, bin, dir string, target *pgconn.Config, connectQuery string, anyDB bool) (*bouncer, error) {
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	port, err := freePort(ctx)
	if err != nil {
		return nil, err
	}
	db := fmt.Sprintf("host=%s port=%d dbname=%s user=%s", target.Host, target.Port, target.Database, target.User)
	name, urlDB := pgbouncerDB, pgbouncerDB
	if anyDB {
		// The fallback entry: any database name a client asks for is the
		// same name on target's server.
		db = fmt.Sprintf("host=%s port=%d user=%s", target.Host, target.Port, target.User)
		name, urlDB = "*", target.Database
	}
	if target.Password != "" {
		db += " password=" + target.Password
	}
	if connectQuery != "" {
		db += " connect_query='" + connectQuery + "'"
	}
	logPath := filepath.Join(dir, "pgbouncer.log")
	ini := strings.Join([]string{
		"[databases]",
		name + " = " + db,
		"[pgbouncer]",
		"listen_addr = 127.0.0.1",
		"listen_port = " + strconv.Itoa(port),
		"unix_socket_dir =",
		"auth_type = any",
		"pool_mode = transaction",
		"default_pool_size = 20",
		"max_client_conn = 1000",
		"logfile = " + logPath,
		"pidfile = " + filepath.Join(dir, "pgbouncer.pid"),
		"",
	}, "\n")
	iniPath := filepath.Join(dir, "pgbouncer.ini")
	if err := os.WriteFile(iniPath, []byte(ini), 0o644); err != nil { //nolint:gosec // G306: the pooler's OS user must read it
		return nil, err
	}
	if own != nil {
		if err := os.Chown(iniPath, int(own.uid), int(own.gid)); err != nil {
			return nil, err
		}
	}
	// Not CommandContext: the pooler outlives this function; stop ends it.
	cmd := exec.Command(bin, iniPath) //nolint:gosec,noctx // G204: the binary is pgbouncer, found above; it outlives ctx (stop ends it)
	cmd.Dir = dir
	cmd.SysProcAttr = sysProcAttr(own)
	cmd.SysProcAttr.Pdeathsig = syscall.SIGTERM
	out, err := os.Create(filepath.Join(dir, "stderr.log"))
	if err != nil {
		return nil, err
	}
	defer out.Close()
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", bin, err)
	}
	b := &bouncer{cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(b.done) }()
	b.url = (&url.URL{
		Scheme:   "postgres",
		User:     url.User(target.User),
		Host:     net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
		Path:     "/" + urlDB,
		RawQuery: "sslmode=disable",
	}).String()

	var lastErr error
	for ctx.Err() == nil {
		select {
		case <-b.done:
			return nil, fmt.Errorf("pgbouncer exited: %s %s", tail(filepath.Join(dir, "stderr.log")), tail(logPath))
		default:
		}
		if lastErr = pingThrough(ctx, b.url); lastErr == nil {
			return b, nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	b.stop()
	return nil, fmt.Errorf("no query went through pgbouncer within %v: %w\n%s", startTimeout, lastErr, tail(logPath))
}

// pingThrough runs one query through the pooler on a connection of its own.
func pingThrough(ctx context.Context, u string) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, "SELECT 1", pgx.QueryExecModeSimpleProtocol)
	return err
}

// stop ends PgBouncer: SIGINT would wait for clients, SIGTERM does not.
func (b *bouncer) stop() {
	_ = b.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-b.done:
	case <-time.After(stopTimeout):
		_ = b.cmd.Process.Kill()
		<-b.done
	}
}
