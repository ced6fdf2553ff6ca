package admin

import (
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"
)

// Limits on guessing admin keys (issue: 300 wrong keys a second were all
// answered 401, and a short key fell in under a second). Keys of 128 bits
// cannot be guessed at any rate; these limits keep the log readable and
// the guessing slow when a weak key slipped through.
const (
	// FailuresPerAddress is how many wrong keys one client address may
	// present in a burst, and FailureRefill how often it earns one more.
	FailuresPerAddress = 10
	FailureRefill      = 6 * time.Second
	// FailuresOverall and OverallRefill bound wrong keys from every address
	// together (a guesser with many addresses). Past them a wrong key is
	// answered 429 too, but addresses that signed in lately and sessions
	// are never refused, so a guesser cannot lock the operators out.
	FailuresOverall = 60
	OverallRefill   = time.Second
	// SignInsPerAddress and SignInsOverall bound the sign-in forms whose
	// body is being read at once: a client trickling bodies holds no more
	// connections than that.
	SignInsPerAddress = 4
	SignInsOverall    = 32
	// maxTracked bounds the addresses remembered.
	maxTracked = 10000
)

// bucket is a token bucket of failures allowed.
type bucket struct {
	tokens float64
	at     time.Time
}

// level refills b up to burst at one token per every and returns it.
func (b *bucket) level(now time.Time, burst int, every time.Duration) float64 {
	if b.at.IsZero() {
		b.tokens, b.at = float64(burst), now
	}
	b.tokens = min(float64(burst), b.tokens+float64(now.Sub(b.at))/float64(every))
	b.at = now
	return b.tokens
}

// wait is how long until b holds a whole token.
func (b *bucket) wait(every time.Duration) time.Duration {
	return time.Duration((1 - b.tokens) * float64(every))
}

// guard limits failed authentications per client address and overall, and
// the sign-in bodies read at once.
type guard struct {
	mu       sync.Mutex
	byAddr   map[string]*bucket
	overall  bucket
	good     map[string]time.Time // address -> until when it counts as an operator's
	goodFor  time.Duration
	signIns  map[string]int
	inFlight int
}

func newGuard(goodFor time.Duration) *guard {
	return &guard{byAddr: map[string]*bucket{}, good: map[string]time.Time{}, signIns: map[string]int{}, goodFor: goodFor}
}

// allow reports whether a key from addr may be checked now, and if not,
// when to come back.
func (g *guard) allow(addr string) (bool, time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := time.Now()
	b := g.byAddr[addr]
	if b != nil && b.level(now, FailuresPerAddress, FailureRefill) < 1 {
		return false, b.wait(FailureRefill)
	}
	if until, ok := g.good[addr]; ok && now.Before(until) {
		return true, 0
	}
	if g.overall.level(now, FailuresOverall, OverallRefill) < 1 {
		return false, g.overall.wait(OverallRefill)
	}
	return true, 0
}

// failed counts a wrong key from addr.
func (g *guard) failed(addr string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := time.Now()
	b := g.byAddr[addr]
	if b == nil {
		if len(g.byAddr) >= maxTracked {
			g.prune(now)
		}
		b = &bucket{}
		g.byAddr[addr] = b
	}
	b.level(now, FailuresPerAddress, FailureRefill)
	b.tokens--
	g.overall.level(now, FailuresOverall, OverallRefill)
	g.overall.tokens--
}

// succeeded marks addr as an operator's for a while: the overall limit
// does not apply to it.
func (g *guard) succeeded(addr string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := time.Now()
	if len(g.good) >= maxTracked {
		for a, until := range g.good {
			if now.After(until) {
				delete(g.good, a)
			}
		}
	}
	if len(g.good) < maxTracked {
		g.good[addr] = now.Add(g.goodFor)
	}
}

// prune forgets addresses whose bucket is full again, or, when none is,
// half of them.
func (g *guard) prune(now time.Time) {
	for a, b := range g.byAddr {
		if b.level(now, FailuresPerAddress, FailureRefill) >= FailuresPerAddress {
			delete(g.byAddr, a)
		}
	}
	for a := range g.byAddr {
		if len(g.byAddr) < maxTracked/2 {
			break
		}
		delete(g.byAddr, a)
	}
}

// signIn takes a slot to read a sign-in form from addr; the release
// function gives it back.
func (g *guard) signIn(addr string) (release func(), ok bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.signIns[addr] >= SignInsPerAddress || g.inFlight >= SignInsOverall {
		return nil, false
	}
	g.signIns[addr]++
	g.inFlight++
	return func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		g.inFlight--
		if g.signIns[addr]--; g.signIns[addr] <= 0 {
			delete(g.signIns, addr)
		}
	}, true
}

// clientAddr is the address a request came from: the peer's, or, when the
// peer is a trusted proxy, the last address in X-Forwarded-For that is not
// one. IPv6 addresses count by their /64, which one client usually holds
// whole.
func (s *Server) clientAddr(r *http.Request) string {
	ip := peerIP(r)
	if ip.IsValid() && s.trusted(ip) {
		fwd := strings.Split(strings.Join(r.Header.Values("X-Forwarded-For"), ","), ",")
		for i := len(fwd) - 1; i >= 0; i-- {
			a, err := netip.ParseAddr(strings.TrimSpace(fwd[i]))
			if err != nil {
				break
			}
			ip = a.Unmap()
			if !s.trusted(ip) {
				break
			}
		}
	}
	if !ip.IsValid() {
		return r.RemoteAddr
	}
	if ip.Is6() {
		p, _ := ip.Prefix(64)
		return p.String()
	}
	return ip.String()
}

func peerIP(r *http.Request) netip.Addr {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return netip.Addr{}
	}
	return ip.Unmap()
}

// trusted reports whether ip is one of Config.TrustedProxies.
func (s *Server) trusted(ip netip.Addr) bool {
	for _, p := range s.cfg.TrustedProxies {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// secure reports whether r reached us over HTTPS: on a TLS listener, or
// through a trusted proxy that says X-Forwarded-Proto: https.
func (s *Server) secure(r *http.Request) bool {
	if r.TLS != nil {
		return true
	}
	ip := peerIP(r)
	return ip.IsValid() && s.trusted(ip) && strings.EqualFold(strings.TrimSpace(r.Header.Get("X-Forwarded-Proto")), "https")
}

// Reserved reports whether r may be served on one of the admin listener's
// reserve connections (httpserve.Config.Reserved): the sign-in page and
// its stylesheet, and requests of signed-in operators (a live session or
// a valid admin key). Nobody without credentials can fill the reserve.
func (s *Server) Reserved(r *http.Request) bool {
	if r.Method == http.MethodGet && (r.URL.Path == "/admin/login" || strings.HasPrefix(r.URL.Path, "/admin/static/")) {
		return true
	}
	if _, ok := s.sessions.get(r); ok {
		return true
	}
	_, ok := s.bearer(r)
	return ok
}
