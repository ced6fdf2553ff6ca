package client_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// step is what the proxy does with the answer to one request.
type step struct {
	// drop closes the client's connection instead of relaying the answer:
	// the service did the work, the client never hears about it.
	drop bool
	// delay holds the answer back this long before relaying it.
	delay time.Duration
}

// seen is one request that went through the proxy.
type seen struct {
	method, path string
	key          string
	body         []byte
	at           time.Time
	status       int  // of the service's answer, relayed or not
	replayed     bool // the answer carried Idempotent-Replayed: true
}

// String is what a failure prints of a request: not its body.
func (s seen) String() string {
	return fmt.Sprintf("%s %s key=%s → %d replayed=%v", s.method, s.path, s.key, s.status, s.replayed)
}

// onFirstNewCharge returns a plan that does st to the first answer that
// carries a charge the service has just made (a 201 that is not a replay),
// and relays every other answer at once. The service need not answer the
// requests in the order they reached the proxy: on a loaded machine the
// retry can reach the store before the attempt it retries (CI saw it), and
// then the retry's answer is the one that must be lost.
func onFirstNewCharge(st step) func(int, seen) step {
	var done atomic.Bool
	return func(_ int, a seen) step {
		if a.status == http.StatusCreated && !a.replayed && done.CompareAndSwap(false, true) {
			return st
		}
		return step{}
	}
}

// proxy is a TCP proxy on loopback that speaks just enough HTTP/1.1 to find
// request and response boundaries. Every request is forwarded to the
// service and its whole answer read before plan decides whether the client
// gets it, later, or never.
type proxy struct {
	ln       net.Listener
	upstream string
	plan     func(n int, answer seen) step // n counts requests from 1
	// late holds request n back this long before forwarding it: the retry
	// that follows it can reach the service first.
	late func(n int) time.Duration

	mu    sync.Mutex
	n     int
	reqs  []seen
	conns map[net.Conn]struct{}

	closed chan struct{}
	wg     sync.WaitGroup
}

// startProxy proxies to the service at upstreamURL, closed at cleanup.
func startProxy(t *testing.T, upstreamURL string, plan func(n int, answer seen) step) *proxy {
	return startLateProxy(t, upstreamURL, plan, func(int) time.Duration { return 0 })
}

// startLateProxy is startProxy, holding request n back late(n) before
// forwarding it.
func startLateProxy(t *testing.T, upstreamURL string, plan func(n int, answer seen) step, late func(n int) time.Duration) *proxy {
	t.Helper()
	u, err := url.Parse(upstreamURL)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, upstream: u.Host, plan: plan, late: late, conns: map[net.Conn]struct{}{}, closed: make(chan struct{})}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *proxy) URL() string { return "http://" + p.ln.Addr().String() }

// requests returns the requests seen so far.
func (p *proxy) requests() []seen {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]seen(nil), p.reqs...)
}

func (p *proxy) close() {
	close(p.closed)
	p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.closed:
		c.Close()
		return false
	default:
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *proxy) untrack(c net.Conn) {
	c.Close()
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

func (p *proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(c) {
			return
		}
		p.wg.Add(1)
		go p.serve(c)
	}
}

func (p *proxy) serve(client net.Conn) {
	defer p.wg.Done()
	defer p.untrack(client)
	up, err := net.Dial("tcp", p.upstream)
	if err != nil || !p.track(up) {
		return
	}
	defer p.untrack(up)
	cr, ur := bufio.NewReader(client), bufio.NewReader(up)
	for {
		req, err := http.ReadRequest(cr)
		if err != nil {
			return
		}
		body, err := io.ReadAll(req.Body)
		if err != nil {
			return
		}
		p.mu.Lock()
		p.n++
		n := p.n
		p.reqs = append(p.reqs, seen{method: req.Method, path: req.URL.RequestURI(), key: req.Header.Get("Idempotency-Key"), body: body, at: time.Now()})
		p.mu.Unlock()

		if !p.sleep(p.late(n)) {
			return
		}
		req.Body = io.NopCloser(bytes.NewReader(body))
		if err := req.Write(up); err != nil {
			return
		}
		resp, err := http.ReadResponse(ur, req)
		if err != nil {
			return
		}
		rbody, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return
		}
		p.mu.Lock()
		p.reqs[n-1].status = resp.StatusCode
		p.reqs[n-1].replayed = resp.Header.Get("Idempotent-Replayed") == "true"
		answer := p.reqs[n-1]
		p.mu.Unlock()

		st := p.plan(n, answer)
		if st.drop {
			return
		}
		if !p.sleep(st.delay) {
			return
		}
		resp.Body = io.NopCloser(bytes.NewReader(rbody))
		resp.ContentLength = int64(len(rbody))
		resp.TransferEncoding = nil
		if err := resp.Write(client); err != nil {
			return
		}
	}
}

// sleep waits d, and reports false when the proxy closed first.
func (p *proxy) sleep(d time.Duration) bool {
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-p.closed:
		return false
	}
}
