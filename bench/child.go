package bench

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// The kinds of child server.
const (
	kindChargeonce = "chargeonce"
	kindBare       = "bare"
	kindMinimal    = "minimal"
)

// childStartTimeout bounds how long a child may take to answer /healthz
// (it migrates its database first); childStopTimeout how long it may take
// to shut down before it is killed.
const (
	childStartTimeout = 60 * time.Second
	childStopTimeout  = 20 * time.Second
)

// ServeFunc runs `chargeonce serve` with args until ctx ends.
type ServeFunc func(ctx context.Context, args []string) error

// Child is the body of a child process that Run starts through
// Config.ChildCommand: `chargeonce bench child --kind K --addr A --db D
// --api-key S [--pprof P]`. Kind chargeonce calls serve, which must be
// `chargeonce serve` itself, with the flags that point it at the run's
// database and the in-process simulator at zero latency; kind bare runs
// ServeBare. With --pprof the child also serves net/http/pprof on that
// address, so that the parent can take CPU profiles of it.
func Child(ctx context.Context, args []string, serve ServeFunc, stderr io.Writer) error {
	var kind, addr, db, apiKey, pprofAddr, webhooks string
	fs := flag.NewFlagSet("bench child", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&kind, "kind", "", "chargeonce or bare")
	fs.StringVar(&addr, "addr", "", "address to listen on")
	fs.StringVar(&db, "db", "", "database")
	fs.StringVar(&apiKey, "api-key", "", "the benchmark merchant's API key")
	fs.StringVar(&pprofAddr, "pprof", "", "address to serve net/http/pprof on")
	fs.StringVar(&webhooks, "webhooks", "", "on: serve the webhooks merchant and deliver to loopback; off: deliver nothing (another way's events)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if addr == "" || db == "" {
		return errors.New("bench child: --addr and --db are required")
	}
	if pprofAddr != "" {
		stop, err := servePprof(ctx, pprofAddr)
		if err != nil {
			return err
		}
		defer stop()
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	switch kind {
	case kindChargeonce:
		if apiKey == "" {
			return errors.New("bench child: --api-key is required")
		}
		m := merchant
		var extra []string
		switch webhooks {
		case "on":
			m, extra = webhooksMerchant, []string{"--webhooks-allow-private"}
		case "off":
			// Leave the webhooks way's deliveries to its own instance.
			extra = []string{"--webhooks-every", "1000h"}
		}
		return serve(ctx, append([]string{
			"--addr", addr, "--db", db, "--api-keys", m + ":" + apiKey,
			"--acquirer", "sim", "--latency", "0s", "--log-level", "warn",
			// The benchmark measures what the instance can do, not one
			// merchant's allowance; the limiter stays on the path.
			"--merchant-rate", "1000000/s", "--merchant-burst", "1000000",
		}, extra...))
	case kindBare:
		return ServeBare(ctx, addr, db, log)
	case kindMinimal:
		return ServeMinimal(ctx, addr, db, log)
	default:
		return fmt.Errorf("bench child: --kind must be %s, %s or %s; got %q", kindChargeonce, kindBare, kindMinimal, kind)
	}
}

// servePprof serves net/http/pprof's endpoints on addr.
func servePprof(ctx context.Context, addr string) (stop func(), err error) {
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--pprof: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index) // heap, allocs, goroutine, …
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	return func() { _ = srv.Close() }, nil
}

// child is a server process the run started.
type child struct {
	name, kind      string
	addr, pprofAddr string
	cmd             *exec.Cmd
	done            chan struct{}
	waitErr         error
	stopOnce        sync.Once
}

// freeAddr returns a loopback address that was free a moment ago. Another
// process may take it before the child binds it; spawn then tries again.
func freeAddr(ctx context.Context) (string, error) {
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	addr := ln.Addr().String()
	return addr, ln.Close()
}

// spawn starts a child server of kind on db and waits until it answers.
func (b *bench) spawn(ctx context.Context, name, kind, db string) (*child, error) {
	var lastErr error
	for range 3 {
		c, err := b.start(ctx, name, kind, db)
		if err != nil {
			return nil, err
		}
		if err = c.ready(ctx); err == nil {
			b.children = append(b.children, c)
			return c, nil
		}
		c.stop()
		lastErr = err
		if ctx.Err() != nil {
			break
		}
	}
	return nil, fmt.Errorf("starting the %s server: %w", name, lastErr)
}

func (b *bench) start(ctx context.Context, name, kind, db string) (*child, error) {
	addr, err := freeAddr(ctx)
	if err != nil {
		return nil, err
	}
	args := []string{"--kind", kind, "--addr", addr, "--db", db, "--api-key", b.secret}
	switch {
	case name == wayWebhooks:
		args = append(args, "--webhooks", "on")
	case kind == kindChargeonce && b.cfg.Webhooks:
		args = append(args, "--webhooks", "off")
	}
	var pprofAddr string
	if b.cfg.ProfileDir != "" {
		if pprofAddr, err = freeAddr(ctx); err != nil {
			return nil, err
		}
		args = append(args, "--pprof", pprofAddr)
	}
	cmd := b.cfg.ChildCommand(args)
	cmd.Env = childEnv(cmd.Env)
	out := &prefixWriter{w: b.log, prefix: "[" + name + "] "}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting the %s server: %w", name, err)
	}
	c := &child{name: name, kind: kind, addr: addr, pprofAddr: pprofAddr, cmd: cmd, done: make(chan struct{})}
	go func() {
		c.waitErr = cmd.Wait()
		close(c.done)
	}()
	return c, nil
}

// childEnv is the parent's environment (or env, when the command set one)
// without CHARGEONCE_* variables: the benchmark sets every flag it relies
// on, and an operator's CHARGEONCE_ACQUIRER or CHARGEONCE_KEY_TTL must not
// change what is measured.
func childEnv(env []string) []string {
	if env == nil {
		env = os.Environ()
	}
	out := make([]string, 0, len(env))
	for _, kv := range env {
		if !strings.HasPrefix(kv, "CHARGEONCE_") {
			out = append(out, kv)
		}
	}
	return out
}

// ready waits until the child answers GET /healthz.
func (c *child) ready(ctx context.Context) error {
	hc := &http.Client{Timeout: time.Second}
	defer hc.CloseIdleConnections()
	deadline := time.Now().Add(childStartTimeout)
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+c.addr+"/healthz", nil)
		if err != nil {
			return err
		}
		resp, err := hc.Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-c.done:
			return fmt.Errorf("it exited before answering: %w", c.waitErr)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(25 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("it did not answer /healthz within %s", childStartTimeout)
		}
	}
}

// stop asks the child to shut down and kills it if it takes too long.
func (c *child) stop() {
	c.stopOnce.Do(func() {
		select {
		case <-c.done:
			return
		default:
		}
		_ = c.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-c.done:
		case <-time.After(childStopTimeout):
			_ = c.cmd.Process.Kill()
			<-c.done
		}
	})
}

func (c *child) pid() int { return c.cmd.Process.Pid }

// memory reads a process's peak and current resident set size from
// /proc/PID/status (VmHWM, VmRSS), in bytes.
func memory(pid int) (peak, current int64, err error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(string(raw), "\n") {
		name, val, ok := strings.Cut(line, ":")
		if !ok || (name != "VmHWM" && name != "VmRSS") {
			continue
		}
		f := strings.Fields(val)
		if len(f) != 2 || f[1] != "kB" {
			continue
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			continue
		}
		if name == "VmHWM" {
			peak = kb << 10
		} else {
			current = kb << 10
		}
	}
	if peak == 0 {
		return 0, 0, errors.New("no VmHWM in /proc/PID/status")
	}
	return peak, current, nil
}

// resetPeak resets a process's VmHWM to its current RSS (Linux 4.0+), so
// that the next reading is the peak of what happened since.
func resetPeak(pid int) error {
	return os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0)
}

// profile takes a CPU profile of the child for d into path while load
// runs.
func (c *child) profile(ctx context.Context, d time.Duration, path string, load func() error) error {
	if c.pprofAddr == "" {
		return errors.New("the child serves no pprof")
	}
	secs := max(1, int(d.Round(time.Second)/time.Second))
	type got struct {
		body []byte
		err  error
	}
	gc := make(chan got, 1)
	go func() {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", c.pprofAddr, secs), nil)
		if err != nil {
			gc <- got{err: err}
			return
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			gc <- got{err: err}
			return
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err == nil && resp.StatusCode != http.StatusOK {
			err = fmt.Errorf("pprof answered %s: %s", resp.Status, bytes.TrimSpace(body))
		}
		gc <- got{body, err}
	}()
	lerr := load()
	g := <-gc
	if lerr != nil {
		return lerr
	}
	if g.err != nil {
		return g.err
	}
	return os.WriteFile(path, g.body, 0o644)
}

// prefixWriter writes each line to w with a prefix, one Write per line,
// so children's logs stay readable next to each other's.
type prefixWriter struct {
	mu     sync.Mutex
	w      io.Writer
	prefix string
	buf    []byte
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.buf = append(p.buf, b...)
	for {
		i := bytes.IndexByte(p.buf, '\n')
		if i < 0 {
			break
		}
		line := append([]byte(p.prefix), p.buf[:i+1]...)
		if _, err := p.w.Write(line); err != nil {
			return len(b), nil
		}
		p.buf = p.buf[i+1:]
	}
	return len(b), nil
}
