package pgtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

const (
	// startTimeout bounds how long the throwaway server may take to accept
	// connections after it was launched.
	startTimeout = 60 * time.Second
	// stopTimeout bounds a fast shutdown before the server is killed.
	stopTimeout = 30 * time.Second
	// launchAttempts is how many free ports are tried: another process may
	// take the port between our probe and the server's bind.
	launchAttempts = 3
	// maxConnections is generous because every parallel test opens its own
	// pool and the conformance suite runs 100 goroutines at once.
	maxConnections = 300
)

// throwaway is a PostgreSQL cluster that lives in a temporary directory for
// the life of one test binary.
type throwaway struct {
	dir     string
	url     string
	cmd     *exec.Cmd
	done    chan struct{} // closed when the server process has exited
	waitErr error         // valid after done is closed
}

// owner is the OS account the cluster runs as; nil means the current user.
type owner struct {
	name     string
	uid, gid uint32
}

// startThrowaway creates and starts a throwaway cluster. ctx bounds the
// setup and, through exec.CommandContext, the server process itself: pass a
// context that outlives every test, since the cluster is stopped by stop.
func startThrowaway(ctx context.Context) (*throwaway, error) {
	bindir, err := findBinDir(ctx)
	if err != nil {
		return nil, err
	}
	own, err := clusterOwner()
	if err != nil {
		return nil, err
	}

	dir, err := os.MkdirTemp("", "pgtest-")
	if err != nil {
		return nil, fmt.Errorf("creating throwaway cluster directory: %w", err)
	}
	ok := false
	defer func() {
		if !ok {
			os.RemoveAll(dir)
		}
	}()
	if own != nil {
		// initdb refuses a data directory it cannot own, and the server
		// puts its socket and log here.
		if err := os.Chown(dir, int(own.uid), int(own.gid)); err != nil {
			return nil, fmt.Errorf("handing %s to OS user %s: %w", dir, own.name, err)
		}
	}

	data := filepath.Join(dir, "data")
	initdb := command(ctx, own, dir, filepath.Join(bindir, "initdb"),
		"-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync")
	if out, err := initdb.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("initdb %s%s: %w\n%s", data, asUser(own), err, bytes.TrimSpace(out))
	}

	var errs []error
	for range launchAttempts {
		c, err := launch(ctx, own, bindir, dir, data)
		if err == nil {
			ok = true
			return c, nil
		}
		errs = append(errs, err)
	}
	return nil, fmt.Errorf("starting throwaway cluster in %s%s: %w", dir, asUser(own), errors.Join(errs...))
}

// launch starts the server on a free loopback port and waits until it
// accepts connections.
func launch(ctx context.Context, own *owner, bindir, dir, data string) (*throwaway, error) {
	port, err := freePort(ctx)
	if err != nil {
		return nil, err
	}
	logPath := filepath.Join(dir, fmt.Sprintf("postgres-%d.log", port))
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("creating server log: %w", err)
	}
	defer logFile.Close() // the child keeps its own descriptor

	// The unix socket goes into our directory, never the system's
	// /var/run/postgresql, unless the path would exceed the kernel's limit
	// for socket addresses; tests connect over TCP either way.
	sockets := dir
	if len(dir)+len("/.s.PGSQL.65535") >= 100 {
		sockets = ""
	}
	args := []string{
		"-D", data,
		"-p", strconv.Itoa(port),
		"-c", "listen_addresses=127.0.0.1",
		"-c", "unix_socket_directories=" + sockets,
		"-c", "max_connections=" + strconv.Itoa(maxConnections),
		// Durability is worthless for a cluster deleted at exit; speed
		// is not.
		"-c", "fsync=off",
		"-c", "synchronous_commit=off",
		"-c", "full_page_writes=off",
	}
	cmd := command(ctx, own, dir, filepath.Join(bindir, "postgres"), args...)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting postgres: %w", err)
	}
	c := &throwaway{
		dir:  dir,
		url:  fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port),
		cmd:  cmd,
		done: make(chan struct{}),
	}
	go func() {
		c.waitErr = cmd.Wait()
		close(c.done)
	}()

	deadline := time.Now().Add(startTimeout)
	for {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		conn, err := pgconn.Connect(cctx, c.url)
		cancel()
		if err == nil {
			conn.Close(ctx)
			return c, nil
		}
		select {
		case <-c.done:
			return nil, fmt.Errorf("postgres on port %d exited (%w):\n%s", port, c.waitErr, tail(logPath))
		default:
		}
		if time.Now().After(deadline) {
			herr := c.halt()
			return nil, errors.Join(
				fmt.Errorf("postgres on port %d not ready after %v: %w\n%s", port, startTimeout, err, tail(logPath)),
				herr)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stop shuts the server down and removes the cluster's directory.
func (c *throwaway) stop() error {
	return errors.Join(c.halt(), os.RemoveAll(c.dir))
}

// halt asks the server for a fast shutdown (SIGINT) and kills it if it does
// not exit in time.
func (c *throwaway) halt() error {
	var err error
	if c.cmd.Process.Signal(os.Interrupt) == nil {
		select {
		case <-c.done:
		case <-time.After(stopTimeout):
			kerr := c.cmd.Process.Kill()
			<-c.done
			if kerr != nil && !errors.Is(kerr, os.ErrProcessDone) {
				err = fmt.Errorf("postgres did not shut down within %v; killing it: %w", stopTimeout, kerr)
			} else {
				err = fmt.Errorf("postgres did not shut down within %v; killed it", stopTimeout)
			}
		}
	} else {
		<-c.done
	}
	return err
}

// command prepares a PostgreSQL program to run in dir as own; ctx ending
// kills it. dir is one own can enter (the cluster's, handed to it): never
// the test's working directory, which in a clone under a private directory
// (mode 700) the postgres user may not enter; a command as another user
// without one fails to start.
func command(ctx context.Context, own *owner, dir, path string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	cmd.SysProcAttr = sysProcAttr(own)
	if own != nil && dir == "" {
		cmd.Err = fmt.Errorf("%s would run as %s in the test's working directory, which that user may not enter: give it a directory of its own", filepath.Base(path), own.name)
	}
	return cmd
}

// clusterOwner decides which OS user runs the cluster. PostgreSQL refuses
// to run as root, so root hands the cluster to the "postgres" account (the
// one distribution packages create), or to "nobody" when there is none.
func clusterOwner() (*owner, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	var errs []error
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
		gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
		if err1 != nil || err2 != nil {
			errs = append(errs, fmt.Errorf("user %s has a non-numeric uid/gid", name))
			continue
		}
		return &owner{name: name, uid: uint32(uid), gid: uint32(gid)}, nil
	}
	return nil, fmt.Errorf("running as root, but found no OS user to run PostgreSQL as (it refuses root): %w", errors.Join(errs...))
}

// findBinDir locates the directory holding initdb and postgres.
func findBinDir(ctx context.Context) (string, error) {
	var tried []string
	has := func(dir string) bool {
		tried = append(tried, dir)
		for _, prog := range []string{"initdb", "postgres"} {
			if fi, err := os.Stat(filepath.Join(dir, prog)); err != nil || fi.IsDir() {
				return false
			}
		}
		return true
	}
	if pgConfig, err := exec.LookPath("pg_config"); err == nil {
		if out, err := exec.CommandContext(ctx, pgConfig, "--bindir").Output(); err == nil {
			if dir := strings.TrimSpace(string(out)); has(dir) {
				return dir, nil
			}
		}
	}
	// Debian and Ubuntu install one directory per major version; prefer
	// the newest.
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return majorOf(dirs[i]) > majorOf(dirs[j]) })
	for _, dir := range dirs {
		if has(dir) {
			return dir, nil
		}
	}
	for _, dir := range []string{"/usr/local/pgsql/bin", "/usr/pgsql/bin"} {
		if has(dir) {
			return dir, nil
		}
	}
	if initdb, err := exec.LookPath("initdb"); err == nil {
		if dir := filepath.Dir(initdb); has(dir) {
			return dir, nil
		}
	}
	return "", fmt.Errorf("no PostgreSQL server binaries (initdb, postgres) found; looked in pg_config --bindir, /usr/lib/postgresql/*/bin and PATH (tried %s)", strings.Join(tried, ", "))
}

// majorOf extracts the version from /usr/lib/postgresql/<major>/bin.
func majorOf(binDir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return n
}

// freePort asks the kernel for a free loopback port.
func freePort(ctx context.Context) (int, error) {
	l, err := (&net.ListenConfig{}).Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("finding a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// tail returns the end of a server log for an error message.
func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(no server log: %v)", err)
	}
	const maxTail = 4000
	if len(b) > maxTail {
		b = b[len(b)-maxTail:]
	}
	return string(bytes.TrimSpace(b))
}

func asUser(own *owner) string {
	if own == nil {
		return ""
	}
	return " as OS user " + own.name
}
