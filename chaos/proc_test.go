package chaos

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// This file builds the chargeonce binary (once per build tag set) and runs
// it as real processes that the nemesis kills, stops and resumes.

// startTimeout bounds how long a process may take to say it listens.
// Generous: the machine is shared with other test runs.
const startTimeout = 60 * time.Second

var (
	buildsMu  sync.Mutex
	builds    = map[string]string{} // tags -> binary
	buildDirs []string
)

// binary builds ./cmd/chargeonce with the build tags (comma-separated, ""
// for none) once per test binary and returns its path.
func binary(t *testing.T, tags string) string {
	t.Helper()
	buildsMu.Lock()
	defer buildsMu.Unlock()
	if p, ok := builds[tags]; ok {
		return p
	}
	dir, err := os.MkdirTemp("", "chargeonce-chaos-")
	if err != nil {
		t.Fatal(err)
	}
	buildDirs = append(buildDirs, dir)
	path := filepath.Join(dir, "chargeonce")
	args := []string{"build", "-o", path}
	if tags != "" {
		args = append(args, "-tags", tags)
	}
	// "go" is the toolchain running these tests: go test puts its
	// GOROOT/bin first in the test binary's PATH.
	cmd := exec.Command("go", append(args, "github.com/chargeonce/chargeonce/cmd/chargeonce")...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build -tags %q ./cmd/chargeonce: %v\n%s", tags, err, out)
	}
	builds[tags] = path
	return path
}

// withBuildsRemoved wraps m so that running it also removes the binaries.
type withBuildsRemoved struct{ m interface{ Run() int } }

func (w withBuildsRemoved) Run() int {
	defer func() {
		for _, d := range buildDirs {
			os.RemoveAll(d)
		}
	}()
	return w.m.Run()
}

// proc is one chargeonce process.
type proc struct {
	t    *testing.T
	name string
	bin  string
	args []string
	log  string // stdout and stderr of every run

	mu      sync.Mutex
	cmd     *exec.Cmd
	done    chan struct{}
	addr    string
	stopped bool // SIGSTOPped and not yet resumed
}

var listenRE = regexp.MustCompile(`msg="(chargeonce|acquirer simulator) listening" addr=(\S+)`)

// startProc starts `bin args...` with its log in dir; it waits for the
// address it listens on when wantAddr.
func startProc(t *testing.T, dir, bin, name string, wantAddr bool, args ...string) *proc {
	t.Helper()
	p := &proc{t: t, name: name, bin: bin, args: args, log: filepath.Join(dir, name+".log")}
	if err := p.run(wantAddr); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.signal(syscall.SIGCONT)
		p.kill()
	})
	return p
}

// run starts the process; with wantAddr it waits until it logs its address.
// It returns an error rather than failing the test: the nemesis calls it
// from its own goroutine.
func (p *proc) run(wantAddr bool) error {
	f, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	fmt.Fprintf(f, "=== %s: chargeonce %s\n", time.Now().Format(time.RFC3339Nano), strings.Join(p.args, " "))
	offset, _ := f.Seek(0, io.SeekEnd)
	cmd := exec.Command(p.bin, p.args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "CHARGEONCE_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	if err := cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("starting %s: %w", p.name, err)
	}
	f.Close()
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	p.mu.Lock()
	p.cmd, p.done, p.stopped = cmd, done, false
	p.mu.Unlock()
	if !wantAddr {
		return nil
	}
	deadline := time.Now().Add(startTimeout)
	for {
		if m := listenRE.FindStringSubmatch(p.logSince(offset)); m != nil {
			p.mu.Lock()
			p.addr = m[2]
			p.mu.Unlock()
			return nil
		}
		select {
		case <-done:
			return fmt.Errorf("%s exited before listening (%v):\n%s", p.name, cmd.ProcessState, tailOf(p.logSince(0), 60))
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not log its address within %s:\n%s", p.name, startTimeout, tailOf(p.logSince(0), 60))
		}
	}
}

// Addr is the host:port the process listens on.
func (p *proc) Addr() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.addr
}

// kill sends SIGKILL (a crash: no shutdown, no deferred writes) and waits
// for the process to be gone.
func (p *proc) kill() {
	p.signal(syscall.SIGKILL)
	p.mu.Lock()
	done := p.done
	p.stopped = false
	p.mu.Unlock()
	if done != nil {
		select {
		case <-done:
		case <-time.After(10 * time.Second):
		}
	}
}

// alive reports whether the process is running (stopped counts).
func (p *proc) alive() bool {
	p.mu.Lock()
	done := p.done
	p.mu.Unlock()
	if done == nil {
		return false
	}
	select {
	case <-done:
		return false
	default:
		return true
	}
}

// pause sends SIGSTOP; resume sends SIGCONT.
func (p *proc) pause() {
	p.signal(syscall.SIGSTOP)
	p.mu.Lock()
	p.stopped = true
	p.mu.Unlock()
}

func (p *proc) resume() {
	p.signal(syscall.SIGCONT)
	p.mu.Lock()
	p.stopped = false
	p.mu.Unlock()
}

func (p *proc) signal(sig os.Signal) {
	p.mu.Lock()
	cmd := p.cmd
	p.mu.Unlock()
	if cmd != nil && cmd.Process != nil {
		_ = cmd.Process.Signal(sig)
	}
}

func (p *proc) logSince(offset int64) string {
	b, err := os.ReadFile(p.log)
	if err != nil || int64(len(b)) < offset {
		return ""
	}
	return string(b[offset:])
}

// tailOf returns the last n lines of s.
func tailOf(s string, n int) string {
	var lines []string
	sc := bufio.NewScanner(strings.NewReader(s))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
