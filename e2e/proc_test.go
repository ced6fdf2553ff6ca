package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/internal/apitest"
)

// This file starts real chargeonce processes for the crash and fault tests:
// the binary is built once per test binary, every process logs to a file in
// its test's TempDir, the logs are printed when the test fails, and every
// process still running is killed when its test ends.

// startTimeout bounds how long a process may take to say it is listening.
// Generous: the machine is shared with other test runs.
const startTimeout = 60 * time.Second

// buildDir holds the built binary; removeBuild deletes it.
var buildDir string

// build builds the binary once per test binary and returns its path.
var build = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "chargeonce-e2e-")
	if err != nil {
		return "", err
	}
	buildDir = dir
	path := filepath.Join(dir, "chargeonce")
	// "go" is the toolchain running these tests: go test puts its
	// GOROOT/bin first in the test binary's PATH.
	cmd := exec.Command("go", "build", "-o", path, "github.com/chargeonce/chargeonce/cmd/chargeonce")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/chargeonce: %w\n%s", err, out)
	}
	return path, nil
})

// binary returns the path of a chargeonce binary built from this tree.
func binary(t *testing.T) string {
	t.Helper()
	path, err := build()
	if err != nil {
		t.Fatalf("building chargeonce: %v", err)
	}
	return path
}

// removeBuild deletes the built binary; TestMain calls it after the tests.
func removeBuild() {
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
}

// withBuildRemoved wraps m so that running it also removes the binary.
type withBuildRemoved struct{ m interface{ Run() int } }

func (w withBuildRemoved) Run() int {
	defer removeBuild()
	return w.m.Run()
}

// proc is one chargeonce process.
type proc struct {
	t    *testing.T
	name string
	args []string
	log  string // path of the log file (stdout and stderr)
	// files, when set, is the descriptor limit the process runs with.
	files int
	// bin, when set, is the binary to run instead of the one built from
	// this tree.
	bin string
	// env is added to the process's environment (KEY=value).
	env []string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	addr string // host:port it listens on, once started
}

// procs tracks a test's processes, to kill them and dump their logs.
type procs struct {
	t   *testing.T
	dir string
	mu  sync.Mutex
	all []*proc
}

// newProcs returns the process set of t. Register it after pgtest.URL, so
// that its cleanup (killing the processes) runs before the schema is dropped.
func newProcs(t *testing.T) *procs {
	ps := &procs{t: t, dir: t.TempDir()}
	t.Cleanup(func() {
		ps.mu.Lock()
		all := ps.all
		ps.mu.Unlock()
		for _, p := range all {
			p.kill()
		}
		if t.Failed() {
			for _, p := range all {
				p.dump()
			}
		}
	})
	return ps
}

var listenRE = regexp.MustCompile(`msg="(chargeonce|acquirer simulator) listening" addr=(\S+)`)

// start starts `chargeonce args...` and, when wantAddr, waits for it to log
// the address it listens on. The process's environment carries no
// CHARGEONCE_* variable, so only args configure it.
func (ps *procs) start(name string, args ...string) *proc {
	ps.t.Helper()
	return ps.startWith(name, 0, args...)
}

// startWith is start with the process's descriptor limit set to files
// (when not 0).
func (ps *procs) startWith(name string, files int, args ...string) *proc {
	ps.t.Helper()
	return ps.startProc(&proc{t: ps.t, name: name, args: args, files: files, log: filepath.Join(ps.dir, name+".log")})
}

// startBinary is start with the binary at bin (another release's) instead
// of the one built from this tree.
func (ps *procs) startBinary(name, bin string, args ...string) *proc {
	ps.t.Helper()
	return ps.startProc(&proc{t: ps.t, name: name, args: args, bin: bin, log: filepath.Join(ps.dir, name+".log")})
}

// startEnv is start with env (KEY=value) added to the process's
// environment.
func (ps *procs) startEnv(name string, env []string, args ...string) *proc {
	ps.t.Helper()
	return ps.startProc(&proc{t: ps.t, name: name, args: args, env: env, log: filepath.Join(ps.dir, name+".log")})
}

func (ps *procs) startProc(p *proc) *proc {
	ps.t.Helper()
	args := p.args
	ps.mu.Lock()
	ps.all = append(ps.all, p)
	ps.mu.Unlock()
	p.run(args[0] == "serve" || args[0] == "acquirer")
	return p
}

func (p *proc) run(wantAddr bool) {
	p.t.Helper()
	f, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		p.t.Fatal(err)
	}
	fmt.Fprintf(f, "=== %s: chargeonce %s\n", time.Now().Format(time.RFC3339Nano), strings.Join(p.args, " "))
	offset, _ := f.Seek(0, io.SeekEnd)
	exe := p.bin
	if exe == "" {
		exe = binary(p.t)
	}
	cmd := exec.Command(exe, p.args...)
	if p.files > 0 {
		cmd = limitedCommand(p.t, p.files, exe, p.args...)
	}
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = sysProcAttr()
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "CHARGEONCE_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, p.env...)
	if err := cmd.Start(); err != nil {
		f.Close()
		p.t.Fatalf("starting %s: %v", p.name, err)
	}
	f.Close() // the child holds its own descriptor
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }() // the outcome is in cmd.ProcessState
	p.mu.Lock()
	p.cmd, p.done, p.addr = cmd, done, ""
	p.mu.Unlock()
	if !wantAddr {
		return
	}
	deadline := time.Now().Add(startTimeout)
	for {
		if m := listenRE.FindStringSubmatch(p.logSince(offset)); m != nil {
			p.mu.Lock()
			p.addr = m[2]
			p.mu.Unlock()
			return
		}
		select {
		case <-done:
			p.t.Fatalf("%s exited before listening (%v):\n%s", p.name, cmd.ProcessState, p.logSince(0))
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("%s did not log its address within %s:\n%s", p.name, startTimeout, p.logSince(0))
		}
	}
}

// URL is the process's base URL.
func (p *proc) URL() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return "http://" + p.addr
}

// Addr is the host:port the process listens on.
func (p *proc) Addr() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.addr
}

// restart starts the process again with the same arguments, except that
// args replaces them when given. Its log continues in the same file.
func (p *proc) restart(args ...string) {
	p.t.Helper()
	p.kill()
	if len(args) > 0 {
		p.args = args
	}
	p.run(true)
}

// kill sends SIGKILL (no shutdown, no deferred writes: a crash) and waits
// for the process to be gone.
func (p *proc) kill() {
	p.signal(syscall.SIGKILL)
	p.wait(10 * time.Second)
}

func (p *proc) signal(sig os.Signal) {
	p.mu.Lock()
	cmd := p.cmd
	p.mu.Unlock()
	if cmd != nil && cmd.Process != nil {
		_ = cmd.Process.Signal(sig)
	}
}

// wait waits up to d for the process to exit and reports whether it did.
func (p *proc) wait(d time.Duration) bool {
	p.mu.Lock()
	done := p.done
	p.mu.Unlock()
	if done == nil {
		return true
	}
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
}

// exitErr returns the exit status of a process that has exited.
func (p *proc) exitErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd.ProcessState == nil {
		return fmt.Errorf("%s is still running", p.name)
	}
	if !p.cmd.ProcessState.Success() {
		return fmt.Errorf("%s: %s", p.name, p.cmd.ProcessState)
	}
	return nil
}

func (p *proc) logSince(offset int64) string {
	b, err := os.ReadFile(p.log)
	if err != nil || int64(len(b)) < offset {
		return ""
	}
	return string(b[offset:])
}

// logText is everything the process (and its earlier runs) logged.
func (p *proc) logText() string { return p.logSince(0) }

// dump prints the process's log into the test's output, the last lines of
// a long one.
func (p *proc) dump() {
	const maxLines = 300
	var lines []string
	sc := bufio.NewScanner(strings.NewReader(p.logText()))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	skipped := 0
	if len(lines) > maxLines {
		skipped = len(lines) - maxLines
		lines = lines[skipped:]
	}
	p.t.Logf("----- log of %s (%s; %d earlier lines skipped) -----\n%s", p.name, p.log, skipped, strings.Join(lines, "\n"))
}

// uniqueName returns prefix followed by random hex: application names must
// not collide across the parallel tests that share one server.
func uniqueName(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// withParams adds query parameters to a postgres:// URL.
func withParams(url string, kv ...string) string {
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	for i := 0; i+1 < len(kv); i += 2 {
		url += sep + kv[i] + "=" + kv[i+1]
		sep = "&"
	}
	return url
}

// startAcquirer starts a stand-alone acquirer simulator.
func (ps *procs) startAcquirer(name string, args ...string) *proc {
	ps.t.Helper()
	return ps.start(name, append([]string{"acquirer", "--addr", "127.0.0.1:0"}, args...)...)
}

// serveArgs returns the arguments of a serve process on db and acquirer,
// followed by extra (later flags win).
func serveArgs(db, acquirerURL string, extra ...string) []string {
	return append([]string{"serve", "--addr", "127.0.0.1:0", "--db", db, "--acquirer", acquirerURL}, extra...)
}

// answer is one HTTP exchange with a chargeonce instance.
type answer struct {
	status int
	header http.Header
	body   []byte
	err    error
}

func (a answer) final() bool { return a.err == nil && (a.status == 201 || a.status == 402) }

func (a answer) String() string {
	if a.err != nil {
		return "error: " + a.err.Error()
	}
	return fmt.Sprintf("%d %s", a.status, bytes.TrimSpace(a.body))
}

// charge posts body under key with the demo merchant's API key.
func charge(c *http.Client, base, key string, body []byte) answer {
	req, err := http.NewRequest("POST", base+"/v1/charges", bytes.NewReader(body))
	if err != nil {
		return answer{err: err}
	}
	req.Header.Set("Authorization", "Bearer "+apitest.APIKey)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	resp, err := c.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, header: resp.Header, body: b, err: err}
}

// untilFinal retries the intent on the instances in turn until it gets a
// final answer (201 or 402), and returns it with every answer before it.
func untilFinal(t *testing.T, d time.Duration, bases func() []string, key string, body []byte) (answer, []answer) {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second}
	deadline := time.Now().Add(d)
	var trail []answer
	for i := 0; ; i++ {
		bs := bases()
		a := charge(c, bs[i%len(bs)], key, body)
		if a.final() {
			return a, trail
		}
		// 202 and 409 say "not yet"; a 5xx says the attempt failed before
		// the acquirer was called (a killed database connection), and the
		// client retries it like a timeout.
		if a.err == nil && a.status != 202 && a.status != 409 && a.status < 500 {
			t.Fatalf("%s: unexpected answer %s (after %v)", key, a, trail)
		}
		if a.err == nil && a.status == 409 && a.header.Get("Retry-After") == "" {
			t.Fatalf("%s: 409 without Retry-After", key)
		}
		trail = append(trail, a)
		if time.Now().After(deadline) {
			t.Fatalf("%s: no final answer within %s; answers: %v", key, d, trail)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// wantReplays wants every instance to replay want, byte for byte.
func wantReplays(t *testing.T, bases []string, key string, body []byte, want answer) {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second}
	for _, b := range bases {
		a := charge(c, b, key, body)
		if a.err != nil || a.status != want.status || !bytes.Equal(a.body, want.body) || a.header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("%s: replay on %s = %s (Idempotent-Replayed %q); want the stored %s", key, b, a, a.header.Get("Idempotent-Replayed"), want)
		}
	}
}

// chargeBody returns a charge request body.
func chargeBody(order int64, token string) []byte {
	return []byte(fmt.Sprintf(`{"order_id": %d, "amount_cents": 2500, "currency": "BRL", "payment_token": %q}`, order, token))
}

// acquirerClient reads a stand-alone acquirer's captures and stats.
func acquirerClient(p *proc) *acquirer.Client {
	return acquirer.NewClient(p.URL(), &http.Client{Timeout: 10 * time.Second})
}

// capturesOf counts the captured captures the acquirer holds for order.
func capturesOf(t *testing.T, acq *acquirer.Client, order int64) (int, []acquirer.Capture) {
	t.Helper()
	list, err := acq.ListByOrder(t.Context(), order, "demo")
	if err != nil {
		t.Fatal(err)
	}
	captured := 0
	for _, c := range list {
		if c.Status == "captured" {
			captured++
		}
	}
	return captured, list
}

// wantOneCapture wants the acquirer to hold exactly one capture for the
// order, captured, under the charge's reference.
func wantOneCapture(t *testing.T, acq *acquirer.Client, order int64, chargeID string) {
	t.Helper()
	list, err := acq.ListByOrder(t.Context(), order, "demo")
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].Reference != chargeID || list[0].Status != "captured" {
		t.Fatalf("order %d: acquirer holds %+v; want one capture under reference %s", order, list, chargeID)
	}
}

// db runs fn on a fresh connection to url (a pgtest URL: its search_path
// names the test's schema).
func db(t *testing.T, url string, fn func(conn *pgx.Conn) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connecting to the test database: %v", err)
	}
	defer conn.Close(context.Background())
	if err := fn(conn); err != nil {
		t.Fatalf("querying the test database: %v", err)
	}
}

// queryInt runs a query returning one integer.
func queryInt(t *testing.T, url, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	db(t, url, func(conn *pgx.Conn) error { return conn.QueryRow(t.Context(), sql, args...).Scan(&n) })
	return n
}

// terminate ends every server connection whose application_name is app and
// returns how many it ended.
func terminate(t *testing.T, adminURL, app string) int64 {
	t.Helper()
	return queryInt(t, adminURL, `
SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))
FROM pg_stat_activity
WHERE datname = current_database() AND application_name = $1 AND pid <> pg_backend_pid()`, app)
}

// metric reads one unlabelled gauge or counter from an instance's /metrics.
func metric(t *testing.T, base, name string) (float64, bool) {
	t.Helper()
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Get(base + "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			return f, err == nil
		}
	}
	return 0, false
}

// newOrder returns an order id no other test uses.
func newOrder() int64 { return orderIDs.Add(1) }

var orderIDs atomic.Int64

func init() { orderIDs.Store(time.Now().UnixNano() % 1e9 * 1000) }
