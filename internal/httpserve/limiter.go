package httpserve

import (
	"container/list"
	"net"
	"net/http"
	"sync"
	"time"
)

// Stats describe a listener's connections at one moment.
type Stats struct {
	// Open is how many connections are open, Idle how many of them wait
	// for a request; Max is the cap.
	Open, Idle, Max int
	// Refused counts connections closed at once because the cap was
	// reached and every open connection was busy with a request; Evicted
	// counts idle connections closed to make room for a new one.
	Refused, Evicted uint64
}

// Limiter caps a listener's open connections. At the cap a new connection
// evicts the connection that has been idle longest (a keep-alive connection
// between requests, or one that has sent nothing yet): an idle connection
// costs a descriptor and memory and serves nobody, while refusing the new one
// would let whoever opened thousands of idle connections first lock everyone
// else out. Only when every connection is in the middle of a request is the
// new one refused, with a 503.
type Limiter struct {
	max int

	mu      sync.Mutex
	conns   map[net.Conn]*list.Element // every open connection; its place in idle, or nil while it serves a request
	idle    *list.List                 // idle connections, the longest idle first
	refused uint64
	evicted uint64
}

// NewLimiter returns a Limiter allowing maxConns open connections.
func NewLimiter(maxConns int) *Limiter {
	return &Limiter{max: max(1, maxConns), conns: map[net.Conn]*list.Element{}, idle: list.New()}
}

// Stats returns the limiter's statistics.
func (l *Limiter) Stats() Stats {
	l.mu.Lock()
	defer l.mu.Unlock()
	return Stats{Open: len(l.conns), Idle: l.idle.Len(), Max: l.max, Refused: l.refused, Evicted: l.evicted}
}

// Listener returns ln capped by l. Its server must report connection states
// to l (Server does: http.Server.ConnState).
func (l *Limiter) Listener(ln net.Listener) net.Listener { return &capListener{Listener: ln, l: l} }

type capListener struct {
	net.Listener
	l *Limiter
}

// Accept returns the next connection the cap admits; the others are
// answered 503 and closed here, never reaching the server.
func (cl *capListener) Accept() (net.Conn, error) {
	for {
		c, err := cl.Listener.Accept()
		if err != nil {
			return nil, err
		}
		admitted, victim := cl.l.admit(c)
		if victim != nil {
			_ = victim.Close()
		}
		if admitted {
			return c, nil
		}
		refuse(c)
	}
}

// admit counts c in if the cap allows it, evicting the longest idle
// connection (returned, for the caller to close outside the lock) when the
// cap is reached.
func (l *Limiter) admit(c net.Conn) (admitted bool, victim net.Conn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.conns) >= l.max {
		front := l.idle.Front()
		if front == nil {
			l.refused++
			return false, nil
		}
		victim = l.idle.Remove(front).(net.Conn)
		delete(l.conns, victim)
		l.evicted++
	}
	// A new connection is idle until it has read a request.
	l.conns[c] = l.idle.PushBack(c)
	return true, victim
}

// refuseTimeout bounds writing the refusal, so a client that reads nothing
// cannot hold the accept loop.
const refuseTimeout = 100 * time.Millisecond

// refusal is the whole answer to a connection over the cap.
const refusal = "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: 29\r\n\r\ntoo many connections; retry\r\n"

func refuse(c net.Conn) {
	_ = c.SetWriteDeadline(time.Now().Add(refuseTimeout))
	_, _ = c.Write([]byte(refusal))
	_ = c.Close()
}

// track follows the server's connection states (http.Server.ConnState).
// Connections evicted or refused are no longer counted and are ignored.
func (l *Limiter) track(c net.Conn, state http.ConnState) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, known := l.conns[c]
	if !known {
		return
	}
	switch state {
	case http.StateActive:
		if e != nil {
			l.idle.Remove(e)
			l.conns[c] = nil
		}
	case http.StateIdle:
		if e != nil {
			l.idle.Remove(e)
		}
		l.conns[c] = l.idle.PushBack(c)
	case http.StateHijacked, http.StateClosed:
		if e != nil {
			l.idle.Remove(e)
		}
		delete(l.conns, c)
	case http.StateNew:
	}
}
