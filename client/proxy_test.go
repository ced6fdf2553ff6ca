package client_test

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync"
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
	status       int // of the service's answer, relayed or not
}

// proxy is a TCP proxy on loopback that speaks just enough HTTP/1.1 to find
// request and response boundaries. Every request is forwarded to the
// service and its whole answer read before plan decides whether the client
// gets it, later, or never.
type proxy struct {
	ln       net.Listener
	upstream string
	plan     func(n int) step // n counts requests from 1

	mu    sync.Mutex
	n     int
	reqs  []seen
	conns map[net.Conn]struct{}

	closed chan struct{}
	wg     sync.WaitGroup
}

// startProxy proxies to the service at upstreamURL, closed at cleanup.
func startProxy(t *testing.T, upstreamURL string, plan func(n int) step) *proxy {
	t.Helper()
	u, err := url.Parse(upstreamURL)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, upstream: u.Host, plan: plan, conns: map[net.Conn]struct{}{}, closed: make(chan struct{})}
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
		p.mu.Unlock()

		st := p.plan(n)
		if st.drop {
			return
		}
		if st.delay > 0 {
			t := time.NewTimer(st.delay)
			select {
			case <-t.C:
			case <-p.closed:
				t.Stop()
				return
			}
		}
		resp.Body = io.NopCloser(bytes.NewReader(rbody))
		resp.ContentLength = int64(len(rbody))
		resp.TransferEncoding = nil
		if err := resp.Write(client); err != nil {
			return
		}
	}
}
