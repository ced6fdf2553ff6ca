package httpserve_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/chargeonce/chargeonce/internal/httpserve"
)

// TestMain checks that no goroutine outlives the tests, but for net/http's
// own: after answering a malformed request (431) a connection sleeps half a
// second before closing, so the client reads the answer before the reset.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("net/http.(*conn).closeWriteAndWait"))
}

// serve starts a Server for handler on a loopback port and returns its
// address.
func serve(t *testing.T, maxConns int, handler http.Handler) (*httpserve.Server, string) {
	t.Helper()
	ln, err := (&net.ListenConfig{}).Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := httpserve.New(httpserve.Config{Name: "test", Handler: handler, MaxConns: maxConns})
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close(); <-done })
	return srv, ln.Addr().String()
}

var ok = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") })

// get sends GET / on c and returns the status line.
func get(t *testing.T, c net.Conn) string {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatalf("writing a request: %v", err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("reading the answer: %v", err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.Status
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// closed reports whether the server closed c (a read sees EOF or a reset).
func closed(c net.Conn) bool {
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := c.Read(make([]byte, 1))
	return err != nil && !isTimeout(err)
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// waitIdle waits until the server counts n open connections, all idle.
// A client reads its answer before net/http marks the connection idle, so a
// test that orders connections by idleness waits for the server to see it.
func waitIdle(t *testing.T, srv *httpserve.Server, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for st := srv.Stats(); st.Open != n || st.Idle != n; st = srv.Stats() {
		if time.Now().After(deadline) {
			t.Fatalf("connections: %+v; want %d open, all idle", srv.Stats(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestCapEvictsLongestIdle: at the cap a new connection is served, and the
// connection idle the longest (here one that served a request, then waited)
// is closed to make room.
func TestCapEvictsLongestIdle(t *testing.T) {
	t.Parallel()
	srv, addr := serve(t, 3, ok)
	conns := make([]net.Conn, 3)
	for i := range conns {
		conns[i] = dial(t, addr)
		if st := get(t, conns[i]); st != "200 OK" {
			t.Fatalf("conn %d: %s", i, st)
		}
		waitIdle(t, srv, i+1)
	}
	// conns[1] becomes the most recently active; conns[0] the longest idle.
	for _, i := range []int{0, 2, 1} {
		if st := get(t, conns[i]); st != "200 OK" {
			t.Fatalf("conn %d: %s", i, st)
		}
		waitIdle(t, srv, 3)
	}

	time.Sleep(150 * time.Millisecond) // idle past the eviction grace
	late := dial(t, addr)
	if st := get(t, late); st != "200 OK" {
		t.Fatalf("the connection over the cap: %s; want it served", st)
	}
	if !closed(conns[0]) {
		t.Error("the longest idle connection is still open")
	}
	if st := get(t, conns[1]); st != "200 OK" {
		t.Errorf("a recently used connection: %s", st)
	}
	st := srv.Stats()
	t.Logf("stats: %+v", st)
	if st.Evicted != 1 || st.Refused != 0 || st.Max != 3 || st.Open > 3 {
		t.Errorf("stats %+v; want 1 evicted, none refused, at most 3 open of 3", st)
	}
}

// TestCapRefusesWhenAllBusy: when every connection is serving a request,
// a new one is answered 503 with Retry-After and closed.
func TestCapRefusesWhenAllBusy(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	srv, addr := serve(t, 2, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-release }))
	defer close(release)
	for range 2 {
		c := dial(t, addr)
		if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for st := srv.Stats(); st.Open != 2 || st.Idle != 0; st = srv.Stats() {
		if time.Now().After(deadline) {
			t.Fatalf("stats %+v", srv.Stats())
		}
		time.Sleep(5 * time.Millisecond)
	}
	c := dial(t, addr)
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("reading the refusal: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Errorf("refusal: %s, Retry-After %q; want 503 with Retry-After", resp.Status, resp.Header.Get("Retry-After"))
	}
	if st := srv.Stats(); st.Refused != 1 || st.Evicted != 0 {
		t.Errorf("stats %+v; want 1 refused", st)
	}
}

// TestHeaderLimit: a request whose headers pass MaxHeaderBytes is answered
// 431 before the server has read much of it; one under it is served.
func TestHeaderLimit(t *testing.T) {
	t.Parallel()
	_, addr := serve(t, 0, ok)
	for _, tc := range []struct {
		pad  int
		want string
	}{
		{pad: 2 << 10, want: "200 OK"},
		{pad: 64 << 10, want: "431 Request Header Fields Too Large"},
	} {
		c := dial(t, addr)
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		go func() {
			_, _ = fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: x\r\nX-Pad: %s\r\n\r\n", strings.Repeat("a", tc.pad))
		}()
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("%d-byte header: %v", tc.pad, err)
		}
		resp.Body.Close()
		if resp.Status != tc.want {
			t.Errorf("%d-byte header: %s; want %s", tc.pad, resp.Status, tc.want)
		}
	}
}

// TestLimits: the server carries the limits every listener shares.
func TestLimits(t *testing.T) {
	t.Parallel()
	srv := httpserve.New(httpserve.Config{Handler: ok, WriteTimeout: 2 * time.Minute})
	h := srv.HTTP
	if h.MaxHeaderBytes != httpserve.MaxHeaderBytes || h.ReadHeaderTimeout != httpserve.ReadHeaderTimeout ||
		h.IdleTimeout != httpserve.IdleTimeout || h.ReadTimeout != httpserve.ReadTimeout || h.WriteTimeout != 2*time.Minute {
		t.Errorf("limits: headers %d, read-header %s, read %s, write %s, idle %s", h.MaxHeaderBytes, h.ReadHeaderTimeout, h.ReadTimeout, h.WriteTimeout, h.IdleTimeout)
	}
	if st := srv.Stats(); st.Max != httpserve.FitDescriptors(httpserve.DefaultMaxConns) {
		t.Errorf("default cap %d", st.Max)
	}
	_ = srv.Shutdown(context.Background())
}

// serveWith starts a Server for cfg on a loopback port.
func serveWith(t *testing.T, cfg httpserve.Config) (*httpserve.Server, string) {
	t.Helper()
	ln, err := (&net.ListenConfig{}).Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := httpserve.New(cfg)
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close(); <-done })
	return srv, ln.Addr().String()
}

// TestReserveServesOnlyReservedRequests: with every ordinary connection
// busy, a health check is served on a reserve connection, any other request
// there is answered 503 without its body being read, and the reserve never
// turns into ordinary connections (a busy reserve refuses the next one).
func TestReserveServesOnlyReservedRequests(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/busy" {
			<-release
		}
		_, _ = io.WriteString(w, "ok")
	})
	srv, addr := serveWith(t, httpserve.Config{Handler: h, MaxConns: 4, Reserve: 2,
		Reserved: func(r *http.Request) bool { return r.URL.Path == "/healthz" }})
	defer close(release)
	for range 2 {
		c := dial(t, addr)
		if _, err := io.WriteString(c, "GET /busy HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for st := srv.Stats(); st.Open != 2 || st.Idle != 0; st = srv.Stats() {
		if time.Now().After(deadline) {
			t.Fatalf("stats %+v", srv.Stats())
		}
		time.Sleep(5 * time.Millisecond)
	}
	// Another ordinary request lands in the reserve: 503, closed at once,
	// its body never read.
	c := dial(t, addr)
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	start := time.Now()
	if _, err := io.WriteString(c, "POST /busy HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || !resp.Close || !closed(c) {
		t.Errorf("an ordinary request on a reserve connection: %s, close %v; want 503 and the connection closed", resp.Status, resp.Close)
	}
	t.Logf("refused in the reserve in %s", time.Since(start).Round(time.Microsecond))
	// Health checks are served there, twice over (both reserve slots).
	for i := range 2 {
		hc := dial(t, addr)
		_ = hc.SetDeadline(time.Now().Add(5 * time.Second))
		_, _ = io.WriteString(hc, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(hc), nil)
		if err != nil {
			t.Fatalf("health check %d: %v", i, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("health check %d: %s", i, resp.Status)
		}
	}
	if st := srv.Stats(); st.InReserve != 2 || st.Reserve != 2 {
		t.Errorf("stats %+v; want 2 in the reserve of 2", st)
	}
}

// TestUnreadBodyNeverHoldsTheConnection: a handler that answers without
// reading the body (a 401 before the body) is not held by a body that
// trickles in; one that reads it gets BodyReadTimeout.
func TestUnreadBodyNeverHoldsTheConnection(t *testing.T) {
	t.Parallel()
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") == "" {
			http.Error(w, "no key", http.StatusUnauthorized)
			return
		}
		if _, err := io.ReadAll(r.Body); err != nil {
			http.Error(w, "slow body", http.StatusBadRequest)
			return
		}
		_, _ = io.WriteString(w, "ok")
	})
	_, addr := serveWith(t, httpserve.Config{Handler: h})
	for _, tc := range []struct {
		header string
		want   int
		within time.Duration
	}{
		{"", http.StatusUnauthorized, time.Second},
		{"Authorization: Bearer k\r\n", http.StatusBadRequest, httpserve.BodyReadTimeout + 2*time.Second},
	} {
		c := dial(t, addr)
		stop := make(chan struct{})
		go func() { // a byte every 200 ms, as slow as a client may be
			for {
				select {
				case <-stop:
					return
				case <-time.After(200 * time.Millisecond):
					_, _ = c.Write([]byte("x"))
				}
			}
		}()
		start := time.Now()
		_ = c.SetDeadline(time.Now().Add(20 * time.Second))
		_, _ = io.WriteString(c, "POST / HTTP/1.1\r\nHost: x\r\n"+tc.header+"Content-Length: 100000\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			close(stop)
			t.Fatalf("%q: %v", tc.header, err)
		}
		resp.Body.Close()
		isClosed := closed(c)
		took := time.Since(start)
		close(stop)
		t.Logf("%q: %s, closed after %s", tc.header, resp.Status, took.Round(time.Millisecond))
		if resp.StatusCode != tc.want || !isClosed || took > tc.within {
			t.Errorf("%q: %s, closed %v after %s; want %d and closed within %s", tc.header, resp.Status, isClosed, took, tc.want, tc.within)
		}
	}
}
