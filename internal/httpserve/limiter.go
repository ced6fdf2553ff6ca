package httpserve

import (
	"container/list"
	"crypto/tls"
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
	// Reserve is how many connections are kept for reserved requests, and
	// InReserve how many reserve connections are open.
	Reserve, InReserve int
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
	// reserve is how many of the max connections only requests a
	// listener reserves them for (health checks, signed-in operators) may
	// use: connections past max-reserve are admitted as reserve
	// connections, see reservedConn.
	reserve int

	mu    sync.Mutex
	conns map[net.Conn]*list.Element // every open connection; its place in its idle list, or nil while it serves a request
	// idle and idleReserve hold the idle ordinary and reserve connections,
	// the longest idle first. The two are evicted separately, so that the
	// reserve never turns into ordinary connections.
	idle, idleReserve *list.List
	inReserve         int
	refused           uint64
	evicted           uint64
}

// NewLimiterReserve returns a Limiter allowing maxConns open connections,
// the last reserve of which are reserve connections (at most maxConns-1).
func NewLimiterReserve(maxConns, reserve int) *Limiter {
	l := NewLimiter(maxConns)
	l.reserve = min(max(0, reserve), l.max-1)
	return l
}

// reservedConn is a connection admitted into the reserve: it serves only
// the requests its listener reserves (Config.Reserved); any other request
// on it is answered 503 and the connection closed.
type reservedConn struct{ net.Conn }

// NewLimiter returns a Limiter allowing maxConns open connections.
func NewLimiter(maxConns int) *Limiter {
	return &Limiter{max: max(1, maxConns), conns: map[net.Conn]*list.Element{}, idle: list.New(), idleReserve: list.New()}
}

// Stats returns the limiter's statistics.
func (l *Limiter) Stats() Stats {
	l.mu.Lock()
	defer l.mu.Unlock()
	return Stats{Open: len(l.conns), Idle: l.idle.Len() + l.idleReserve.Len(), Max: l.max, Refused: l.refused, Evicted: l.evicted,
		Reserve: l.reserve, InReserve: l.inReserve}
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
		if admitted != nil {
			return admitted, nil
		}
		refuse(c)
	}
}

// admit counts c in if the cap allows it and returns the connection to
// serve (c, or c as a reservedConn), evicting the longest idle connection
// (returned, for the caller to close outside the lock) when the ordinary
// connections are all taken. Only when none of them is idle does c go into
// the reserve (evicting the longest idle reserve connection when the
// reserve is full), and only when every reserve connection is busy too is
// c refused (nil).
func (l *Limiter) admit(c net.Conn) (admitted, victim net.Conn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	idle := l.idle
	admitted = c
	if len(l.conns)-l.inReserve >= l.max-l.reserve {
		now := time.Now()
		switch front, frontReserve := evictable(l.idle, now), evictable(l.idleReserve, now); {
		case front != nil:
			victim = l.idle.Remove(front).(idler).conn
			l.evicted++
		case l.inReserve < l.reserve:
			admitted, idle = &reservedConn{Conn: c}, l.idleReserve
			l.inReserve++
		case frontReserve != nil:
			victim = l.idleReserve.Remove(frontReserve).(idler).conn
			admitted, idle = &reservedConn{Conn: c}, l.idleReserve
			l.evicted++
		default:
			l.refused++
			return nil, nil
		}
		if victim != nil {
			delete(l.conns, victim)
		}
	}
	// A new connection is idle until it has read a request.
	l.conns[admitted] = idle.PushBack(idler{admitted, time.Now()})
	return admitted, victim
}

// evictGrace is how long a connection must have been idle before a new
// one may evict it. A connection that has just been accepted is "idle"
// until its request has been read; without the grace, a flood of new
// connections would evict each other, and a health check among them,
// before any request was read.
const evictGrace = 100 * time.Millisecond

// idler is an entry of an idle list: the connection and since when it is
// idle.
type idler struct {
	conn  net.Conn
	since time.Time
}

// evictScan bounds how many idle connections one admission looks at (under
// the limiter's lock) for one with nothing unread.
const evictScan = 16

// evictable returns the longest idle connection of idle that has been idle
// for evictGrace and holds no unread bytes, or nil. A connection whose
// request has arrived but not been read yet (a machine short of CPU can
// take longer than the grace to get to it) is skipped: closing it would
// drop a request its client already sent, with no answer, where refusing
// the new connection answers it 503 with Retry-After.
func evictable(idle *list.List, now time.Time) *list.Element {
	for e, n := idle.Front(), 0; e != nil && n < evictScan && now.Sub(e.Value.(idler).since) >= evictGrace; e, n = e.Next(), n+1 {
		if !unread(e.Value.(idler).conn) {
			return e
		}
	}
	return nil
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
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn() // served over TLS: the connection Accept returned
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	e, known := l.conns[c]
	if !known {
		return
	}
	idle := l.idle
	_, reserved := c.(*reservedConn)
	if reserved {
		idle = l.idleReserve
	}
	switch state {
	case http.StateActive:
		if e != nil {
			idle.Remove(e)
			l.conns[c] = nil
		}
	case http.StateIdle:
		if e != nil {
			idle.Remove(e)
		}
		l.conns[c] = idle.PushBack(idler{c, time.Now()})
	case http.StateHijacked, http.StateClosed:
		if e != nil {
			idle.Remove(e)
		}
		delete(l.conns, c)
		if reserved {
			l.inReserve--
		}
	case http.StateNew:
	}
}
