package pgtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Server is a throwaway PostgreSQL server that belongs to one test, for
// tests that take the database away: crash it, restart it, fail it over.
// Unlike the shared server behind URL, it runs with synchronous_commit=on,
// so what a client was told is committed survives an immediate shutdown
// (fsync stays off: the test crashes the server, never the machine, so the
// operating system keeps every write).
//
// It is stopped and its directory removed when the test ends. It works when
// the tests run as root, like the shared cluster: every PostgreSQL program
// runs as the "postgres" OS user then.
type Server struct {
	t      testing.TB
	bindir string
	own    *owner
	dir    string // owned by own; holds data/, the socket and the log
	data   string
	port   int
	extra  []string // more -c settings

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
}

// serverSetupTimeout bounds initdb, pg_basebackup and a promotion.
const serverSetupTimeout = 60 * time.Second

// NewServer initialises and starts a server of t's own on a free loopback
// port. Its URL names the database "postgres"; the test owns the whole
// server, so there is no per-test schema.
func NewServer(t testing.TB) *Server {
	t.Helper()
	s := newServer(t, "server")
	initdb := command(t.Context(), s.own, s.dir, filepath.Join(s.bindir, "initdb"),
		"-D", s.data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync")
	if out, err := initdb.CombinedOutput(); err != nil {
		t.Fatalf("pgtest: initdb %s%s: %v\n%s", s.data, asUser(s.own), err, out)
	}
	s.Start()
	return s
}

// newServer prepares the directory of a server (owned by the cluster's OS
// user) and picks its port; it does not start it.
func newServer(t testing.TB, name string) *Server {
	t.Helper()
	bindir, err := findBinDir(t.Context())
	if err != nil {
		t.Fatalf("pgtest: %v\n\n%s", err, howToProvide)
	}
	own, err := clusterOwner()
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	dir, err := os.MkdirTemp("", "pgtest-"+name+"-")
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	if own != nil {
		if err := os.Chown(dir, int(own.uid), int(own.gid)); err != nil {
			os.RemoveAll(dir)
			t.Fatalf("pgtest: handing %s to OS user %s: %v", dir, own.name, err)
		}
	}
	port, err := freePort(t.Context())
	if err != nil {
		os.RemoveAll(dir)
		t.Fatalf("pgtest: %v", err)
	}
	s := &Server{t: t, bindir: bindir, own: own, dir: dir, data: filepath.Join(dir, "data"), port: port}
	t.Cleanup(func() {
		s.halt()
		os.RemoveAll(dir)
	})
	return s
}

// Port is the server's TCP port on 127.0.0.1; it stays the same across
// restarts.
func (s *Server) Port() int { return s.port }

// Host is the server's host:port.
func (s *Server) Host() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// URL is a connection URL for the database "postgres".
func (s *Server) URL() string {
	return "postgres://postgres@" + s.Host() + "/postgres?sslmode=disable"
}

// Start starts the server (again, after Crash) on its port, and waits until
// it accepts connections; a server recovering from a crash replays its WAL
// first.
func (s *Server) Start() {
	s.t.Helper()
	s.mu.Lock()
	if s.done != nil {
		select {
		case <-s.done:
		default:
			s.mu.Unlock()
			s.t.Fatalf("pgtest: server on port %d is already running", s.port)
		}
	}
	args := []string{
		"-D", s.data,
		"-p", strconv.Itoa(s.port),
		"-c", "listen_addresses=127.0.0.1",
		"-c", "unix_socket_directories=" + socketDir(s.dir),
		"-c", "max_connections=100",
		"-c", "fsync=off",
		"-c", "synchronous_commit=on",
	}
	for _, kv := range s.extra {
		args = append(args, "-c", kv)
	}
	logFile, err := os.OpenFile(s.logPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		s.mu.Unlock()
		s.t.Fatalf("pgtest: %v", err)
	}
	// Not the test's context: that ends before the cleanup that stops the
	// server (halt) runs, and would SIGKILL it first.
	cmd := command(context.Background(), s.own, s.dir, filepath.Join(s.bindir, "postgres"), args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	err = cmd.Start()
	logFile.Close()
	if err != nil {
		s.mu.Unlock()
		s.t.Fatalf("pgtest: starting postgres: %v", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()

	deadline := time.Now().Add(startTimeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		conn, err := pgconn.Connect(ctx, s.URL())
		cancel()
		if err == nil {
			conn.Close(context.Background())
			return
		}
		select {
		case <-done:
			s.t.Fatalf("pgtest: postgres on port %d exited:\n%s", s.port, tail(s.logPath()))
		default:
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("pgtest: postgres on port %d not ready after %v: %v\n%s", s.port, startTimeout, err, tail(s.logPath()))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Crash stops the server the way a crash would: `pg_ctl stop -m immediate`
// (every process quits at once, nothing is flushed or checkpointed; the
// next start recovers from the WAL). It returns once the server is gone.
func (s *Server) Crash() {
	s.t.Helper()
	ctl := command(s.t.Context(), s.own, s.dir, filepath.Join(s.bindir, "pg_ctl"), "stop", "-D", s.data, "-m", "immediate", "-w")
	if out, err := ctl.CombinedOutput(); err != nil {
		s.t.Fatalf("pgtest: pg_ctl stop -m immediate: %v\n%s", err, out)
	}
	s.mu.Lock()
	done := s.done
	s.mu.Unlock()
	select {
	case <-done:
	case <-time.After(stopTimeout):
		s.t.Fatalf("pgtest: postgres on port %d still running after pg_ctl stop -m immediate", s.port)
	}
}

// halt stops a running server for good (SIGQUIT: immediate shutdown).
func (s *Server) halt() {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(quitSignal)
	select {
	case <-done:
	case <-time.After(stopTimeout):
		_ = cmd.Process.Kill()
		<-done
	}
}

func (s *Server) logPath() string { return filepath.Join(s.dir, "postgres.log") }

// Log returns the server's log, for a failing test's output.
func (s *Server) Log() string { return tail(s.logPath()) }

// socketDir is dir, unless the socket path would be too long for the
// kernel; then the server listens on TCP only.
func socketDir(dir string) string {
	if len(dir)+len("/.s.PGSQL.65535") >= 100 {
		return ""
	}
	return dir
}

// Pair is a primary with a synchronous standby: every commit the primary
// acknowledges has reached the standby's disk, so a failover to the standby
// loses nothing a client was told about.
type Pair struct {
	Primary, Standby *Server
}

// NewPair starts a primary (synchronous_standby_names = '*') and a standby
// made from it with pg_basebackup -R (streaming replication), and waits
// until the standby is attached as synchronous.
func NewPair(t testing.TB) *Pair {
	t.Helper()
	p := &Pair{Primary: newServer(t, "primary"), Standby: newServer(t, "standby")}
	pr := p.Primary
	initdb := command(t.Context(), pr.own, pr.dir, filepath.Join(pr.bindir, "initdb"),
		"-D", pr.data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync")
	if out, err := initdb.CombinedOutput(); err != nil {
		t.Fatalf("pgtest: initdb %s%s: %v\n%s", pr.data, asUser(pr.own), err, out)
	}
	pr.extra = []string{"synchronous_standby_names=*", "wal_level=replica", "max_wal_senders=5"}
	pr.Start()

	sb := p.Standby
	// -R writes standby.signal and primary_conninfo; -X stream copies the
	// WAL the backup needs. initdb -A trust allowed replication
	// connections from 127.0.0.1.
	backup := command(t.Context(), sb.own, sb.dir, filepath.Join(sb.bindir, "pg_basebackup"),
		"-h", "127.0.0.1", "-p", strconv.Itoa(pr.port), "-U", "postgres",
		"-D", sb.data, "-R", "-X", "stream", "--no-sync", "-c", "fast")
	if out, err := backup.CombinedOutput(); err != nil {
		t.Fatalf("pgtest: pg_basebackup%s: %v\n%s", asUser(sb.own), err, out)
	}
	sb.Start()
	deadline := time.Now().Add(serverSetupTimeout)
	for {
		var state string
		err := queryRow(pr.URL(), `SELECT COALESCE(max(sync_state), '') FROM pg_stat_replication`, &state)
		if err == nil && state == "sync" {
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("pgtest: the standby did not become synchronous (state %q, %v)\nprimary:\n%s\nstandby:\n%s", state, err, pr.Log(), sb.Log())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// URL is a multi-host URL naming both servers, the standby first, with
// target_session_attrs=read-write: a client connects to whichever is the
// read-write primary, skipping the standby until it has been promoted.
func (p *Pair) URL() string {
	return "postgres://postgres@" + p.Standby.Host() + "," + p.Primary.Host() +
		"/postgres?sslmode=disable&target_session_attrs=read-write"
}

// Failover crashes the primary (pg_ctl stop -m immediate) and promotes the
// standby, returning once the standby accepts writes.
func (p *Pair) Failover() {
	p.Primary.t.Helper()
	p.Primary.Crash()
	var ok bool
	if err := queryRow(p.Standby.URL(), `SELECT pg_promote(true, 60)`, &ok); err != nil || !ok {
		p.Primary.t.Fatalf("pgtest: promoting the standby: %v (promoted %v)\n%s", err, ok, p.Standby.Log())
	}
	deadline := time.Now().Add(serverSetupTimeout)
	for {
		var recovering bool
		err := queryRow(p.Standby.URL(), `SELECT pg_is_in_recovery()`, &recovering)
		if err == nil && !recovering {
			return
		}
		if time.Now().After(deadline) {
			p.Primary.t.Fatalf("pgtest: the promoted standby still in recovery (%v)\n%s", err, p.Standby.Log())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// queryRow runs one single-row query on a connection of its own.
func queryRow(url, sql string, dest ...any) error {
	ctx, cancel := context.WithTimeout(context.Background(), serverSetupTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	err = conn.QueryRow(ctx, sql).Scan(dest...)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("%s: no row", sql)
	}
	return err
}
