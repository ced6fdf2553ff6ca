package e2e

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// These tests attack a real serve process the way issue 17 did, with
// connections rather than requests (SPEC "Tenants share the service
// fairly": slow or huge headers and idle connections by the thousand never
// stop /healthz from being served). They read the process's memory from
// /proc, hence Linux only.

// startFloodTarget starts a serve process on a SQLite database of its own:
// the attacks are on the listener, before any store is involved.
func startFloodTarget(t *testing.T, ps *procs, extra ...string) *proc {
	t.Helper()
	db := "sqlite:" + filepath.Join(t.TempDir(), "flood.db")
	return ps.start("serve", append([]string{"serve", "--addr", "127.0.0.1:0", "--db", db}, extra...)...)
}

// procStatusKiB reads a field such as VmRSS or VmHWM (in KiB) of p from
// /proc/PID/status.
func procStatusKiB(t *testing.T, p *proc, field string) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.pid()))
	if err != nil {
		t.Fatalf("reading the memory of %s: %v", p.name, err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("parsing %s %q: %v", field, v, err)
			}
			return n
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, p.pid())
	return 0
}

func (p *proc) pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd.Process.Pid
}

// probeHealthz sends GET /healthz on a fresh connection and returns how
// long the answer took, or an error.
func probeHealthz(base string) (time.Duration, error) {
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	start := time.Now()
	resp, err := c.Get(base + "/healthz")
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("GET /healthz: %s", resp.Status)
	}
	return time.Since(start), nil
}

// TestFloodHugeHeaders: 600 connections each send ~1 MB of a header that
// never ends. Go's default limit (1 MiB) let every one of them be buffered
// whole while the server waited for the rest (issue 17: 650 MB); with
// chargeonce's limit each is answered 431 after a few KiB and the process
// barely grows.
func TestFloodHugeHeaders(t *testing.T) {
	t.Parallel()
	ps := newProcs(t)
	srv := startFloodTarget(t, ps)
	if _, err := probeHealthz(srv.URL()); err != nil {
		t.Fatal(err)
	}
	before := procStatusKiB(t, srv, "VmRSS")

	const (
		conns   = 600
		padding = 1_000_000 // under Go's default 1 MiB, far over chargeonce's limit
	)
	chunk := bytes.Repeat([]byte("a"), 64<<10)
	var (
		wg                                sync.WaitGroup
		got431, gotOther, noAnswer, wrote atomic.Int64
		sent                              = make(chan struct{}, conns)
		release                           = make(chan struct{})
	)
	start := time.Now()
	for range conns {
		wg.Go(func() {
			c, err := net.DialTimeout("tcp", srv.Addr(), 5*time.Second)
			if err != nil {
				noAnswer.Add(1)
				sent <- struct{}{}
				return
			}
			defer c.Close()
			answered := make(chan string, 1)
			go func() {
				_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
				line, _ := bufio.NewReader(c).ReadString('\n')
				answered <- line
			}()
			// The header line is never finished: no CRLF after the padding.
			if _, err := fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: flood\r\nX-Padding: "); err == nil {
				n := 0
				for n < padding {
					k, err := c.Write(chunk[:min(len(chunk), padding-n)])
					n += k
					if err != nil {
						break
					}
				}
				wrote.Add(int64(n))
			}
			sent <- struct{}{}
			<-release // hold the connection until every one has sent
			_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
			line := <-answered
			switch {
			case strings.Contains(line, " 431 "):
				got431.Add(1)
			case line == "":
				noAnswer.Add(1)
			default:
				gotOther.Add(1)
			}
		})
	}
	for range conns {
		<-sent
	}
	sentIn := time.Since(start)
	time.Sleep(time.Second) // let the server read what is in flight
	after := procStatusKiB(t, srv, "VmRSS")
	peak := procStatusKiB(t, srv, "VmHWM")
	close(release)
	wg.Wait()
	healthz, herr := probeHealthz(srv.URL())

	grewMiB := float64(peak-before) / 1024
	t.Logf("%d connections with %d-byte unfinished headers (%.0f MB written in %s): RSS %.1f MiB before, %.1f MiB after, peak %.1f MiB (+%.1f MiB); answers: %d × 431, %d other, %d none; /healthz then in %s (err %v)",
		conns, padding, float64(wrote.Load())/1e6, sentIn.Round(time.Millisecond), float64(before)/1024, float64(after)/1024, float64(peak)/1024, grewMiB,
		got431.Load(), gotOther.Load(), noAnswer.Load(), healthz.Round(time.Millisecond), herr)
	if herr != nil {
		t.Errorf("/healthz after the flood: %v", herr)
	}
	if got431.Load() < conns*9/10 {
		t.Errorf("%d of %d connections were answered 431 Request Header Fields Too Large; want (nearly) all", got431.Load(), conns)
	}
	if grewMiB > 150 { // ~6 MiB measured; 600 buffered megabytes before the limit
		t.Errorf("the server grew by %.1f MiB holding %d unfinished headers; want it bounded by the header limit", grewMiB, conns)
	}
}

// TestFloodIdleConnections: a client opens idle keep-alive connections by
// the thousand (issue 17: 19,988 of them took every file descriptor and
// /healthz timed out). The server runs with a descriptor limit below the
// flood, as any production limit is below some flood; the connection cap
// keeps it under that limit by evicting the longest idle connections, so
// /healthz on a fresh connection is answered throughout. Without a cap the
// flood stops once the server no longer answers (it has run out of
// descriptors), and the held connections keep it so.
func TestFloodIdleConnections(t *testing.T) {
	t.Parallel()
	const serverFiles = 4096
	flood := 20_000
	// The other tests of this process run alongside and hold descriptors
	// of their own, as does reading /proc: the flood leaves them room.
	const headroom = 4000
	if have := raiseFileLimit(flood + headroom); have < flood+headroom {
		flood = have - headroom
		t.Logf("this test process may open %d files: flooding with %d connections", have, flood)
	}
	if flood <= 2*serverFiles {
		t.Fatalf("the test process cannot open enough connections (%d) to flood a server limited to %d descriptors: raise `ulimit -n`", flood, serverFiles)
	}
	ps := newProcs(t)
	srv := ps.startWith("serve", serverFiles, "serve", "--addr", "127.0.0.1:0", "--db", "sqlite:"+filepath.Join(t.TempDir(), "flood.db"))
	before := procStatusKiB(t, srv, "VmRSS")

	var (
		mu       sync.Mutex
		held     []net.Conn
		ok, fail atomic.Int64
		next     atomic.Int64
		wg       sync.WaitGroup
		probes   probeLog
	)
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	stopProbes := make(chan struct{})
	probesDone := make(chan struct{})
	go func() {
		defer close(probesDone)
		for {
			select {
			case <-stopProbes:
				return
			case <-time.After(250 * time.Millisecond):
				probes.probe(srv.URL())
			}
		}
	}()

	start := time.Now()
	request := []byte("GET /healthz HTTP/1.1\r\nHost: flood\r\n\r\n")
	const maxFailures = 200 // the server has stopped answering: no point going on
	for w := range 64 {
		wg.Go(func() {
			// Spread the sources over several loopback addresses, so the
			// flood does not run out of ephemeral ports.
			d := net.Dialer{Timeout: 2 * time.Second, LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(2+w%8))}}
			for next.Add(1) <= int64(flood) && fail.Load() < maxFailures {
				c, err := d.Dial("tcp", srv.Addr())
				if err != nil {
					fail.Add(1)
					continue
				}
				_ = c.SetDeadline(time.Now().Add(2 * time.Second))
				resp, err := func() (*http.Response, error) {
					if _, err := c.Write(request); err != nil {
						return nil, err
					}
					return http.ReadResponse(bufio.NewReader(c), nil)
				}()
				if err != nil {
					fail.Add(1)
					c.Close()
					continue
				}
				resp.Body.Close()
				ok.Add(1)
				_ = c.SetDeadline(time.Time{})
				mu.Lock()
				held = append(held, c) // idle, kept alive
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	floodTook := time.Since(start)
	close(stopProbes)
	<-probesDone
	var after probeLog
	for range 5 { // the flood's connections are still held
		after.probe(srv.URL())
	}
	rss := procStatusKiB(t, srv, "VmRSS")
	var open, evicted float64
	if len(after.errs) == 0 { // else /metrics would not be answered either
		open, _ = metric(t, srv.URL(), `chargeonce_http_connections_open{listener="api"}`)
		evicted, _ = metric(t, srv.URL(), `chargeonce_http_connections_evicted_total{listener="api"}`)
	}
	t.Logf("%d idle keep-alive connections attempted in %s against a server limited to %d descriptors: %d answered, %d failed; server RSS %.1f → %.1f MiB; open %v, evicted %v",
		ok.Load()+fail.Load(), floodTook.Round(time.Millisecond), serverFiles, ok.Load(), fail.Load(), float64(before)/1024, float64(rss)/1024, open, evicted)
	t.Logf("/healthz on a fresh connection during the flood: %s; after it, %d connections still held: %s", probes.String(), len(held), after.String())
	if len(after.errs) > 0 {
		t.Errorf("/healthz after the flood failed %d of 5 times: %v", len(after.errs), after.errs)
	}
	if n := len(probes.errs); n > (n+len(probes.latencies))/5 {
		t.Errorf("/healthz failed %d of %d times during the flood; want it served", n, n+len(probes.latencies))
	}
	if fail.Load() > 0 {
		t.Errorf("%d flood connections got no answer; want every one answered (the cap evicts idle ones)", fail.Load())
	}
}

// probeLog collects /healthz probes.
type probeLog struct {
	mu        sync.Mutex
	latencies []time.Duration
	errs      []string
}

func (l *probeLog) probe(base string) {
	d, err := probeHealthz(base)
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		l.errs = append(l.errs, err.Error())
		return
	}
	l.latencies = append(l.latencies, d)
}

func (l *probeLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	lat := slices.Sorted(slices.Values(l.latencies))
	pct := func(q float64) time.Duration {
		if len(lat) == 0 {
			return 0
		}
		return lat[int(q*float64(len(lat)-1))].Round(time.Millisecond)
	}
	return fmt.Sprintf("%d answered (p50 %s, p99 %s, max %s), %d failed %v", len(lat), pct(0.5), pct(0.99), pct(1), len(l.errs), firstN(l.errs, 2))
}

func firstN(s []string, n int) []string { return s[:min(n, len(s))] }

// raiseFileLimit raises this process's descriptor limit to at least n if it
// can (root can raise the hard limit) and returns the limit in force.
func raiseFileLimit(n int) int {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0
	}
	if lim.Cur < uint64(n) {
		want := syscall.Rlimit{Cur: uint64(n), Max: max(lim.Max, uint64(n))}
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &want); err != nil {
			want = syscall.Rlimit{Cur: lim.Max, Max: lim.Max}
			_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &want)
		}
		_ = syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim)
	}
	return int(min(lim.Cur, 1<<30)) //nolint:gosec // bounded above
}
