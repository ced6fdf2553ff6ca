package e2e

import (
	"bytes"
	be "encoding/binary"
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"
)

// pgProxy is a TCP proxy between chargeonce and PostgreSQL that can cut the
// connection right after the server committed a statement: it reads the
// server's messages (the v3 protocol frames each one as a type byte and a
// length), and once a DataRow holding the marker has gone by, it holds back
// everything from that row on until the ReadyForQuery that ends the
// statement — by then the autocommit transaction has committed — and closes
// every connection instead of forwarding it. The client sees its statement
// fail; the database holds its rows. For blackout after the cut, every new
// connection is closed at once, so that a follow-up write (a release of the
// key) fails too.
type pgProxy struct {
	t        *testing.T
	ln       net.Listener
	upstream string
	marker   []byte
	blackout time.Duration

	mu      sync.Mutex
	conns   map[net.Conn]struct{}
	cutAt   time.Time // zero until the cut
	cuts    int
	closing bool
}

// startPGProxy proxies to the server of dbURL and returns the proxy and
// dbURL rewritten to go through it.
func startPGProxy(t *testing.T, dbURL string, marker string, blackout time.Duration) (*pgProxy, string) {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &pgProxy{t: t, ln: ln, upstream: u.Host, marker: []byte(marker), blackout: blackout, conns: map[net.Conn]struct{}{}}
	go p.accept()
	t.Cleanup(p.close)
	u.Host = ln.Addr().String()
	return p, u.String()
}

// cutCount reports how many times the proxy cut a committed statement.
func (p *pgProxy) cutCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cuts
}

func (p *pgProxy) close() {
	p.mu.Lock()
	p.closing = true
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.ln.Close()
}

func (p *pgProxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closing || (!p.cutAt.IsZero() && time.Since(p.cutAt) < p.blackout) {
		return false
	}
	for _, c := range cs {
		p.conns[c] = struct{}{}
	}
	return true
}

func (p *pgProxy) untrack(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		delete(p.conns, c)
		c.Close()
	}
}

// cut closes every connection and starts the blackout.
func (p *pgProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cutAt = time.Now()
	p.cuts++
	for c := range p.conns {
		c.Close()
	}
}

func (p *pgProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		go p.serve(c)
	}
}

func (p *pgProxy) serve(client net.Conn) {
	server, err := net.Dial("tcp", p.upstream)
	if err != nil {
		client.Close()
		return
	}
	if !p.track(client, server) {
		client.Close()
		server.Close()
		return
	}
	defer p.untrack(client, server)
	go func() {
		_, _ = io.Copy(server, client)
		server.Close()
	}()
	p.fromServer(server, client)
}

// fromServer forwards the server's messages to the client, message by
// message, cutting after the statement whose row holds the marker.
func (p *pgProxy) fromServer(server, client net.Conn) {
	var held bool
	hdr := make([]byte, 5)
	for {
		if _, err := io.ReadFull(server, hdr); err != nil {
			return
		}
		n := int(be.BigEndian.Uint32(hdr[1:])) - 4
		if n < 0 || n > 64<<20 {
			return
		}
		msg := make([]byte, 5+n)
		copy(msg, hdr)
		if _, err := io.ReadFull(server, msg[5:]); err != nil {
			return
		}
		switch {
		case held && hdr[0] == 'Z':
			// ReadyForQuery: the statement, and its transaction, are over.
			p.cut()
			return
		case held:
			continue
		case hdr[0] == 'D' && len(p.marker) > 0 && bytes.Contains(msg, p.marker) && p.cutCount() == 0:
			held = true
			continue
		}
		if _, err := client.Write(msg); err != nil {
			return
		}
	}
}
