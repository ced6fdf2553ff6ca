package admin

import (
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"
)

// Limits on wrong admin keys (issue 34: 300 wrong keys a second were all
// answered 401). Every key presented is checked first, and a right one is
// always accepted (issue 48: a budget checked before the key let wrong
// keys from 20 addresses lock the operators out, after a restart too):
// only failures are counted, and past a budget they are answered 429
// rather than 401. Keys of 128 bits (serve refuses weaker ones) cannot be
// guessed at any rate; the budgets keep the log and the answers telling.
const (
	// FailuresPerAddress is how many wrong keys one client address may
	// present in a burst, and FailureRefill how often it earns one more.
	FailuresPerAddress = 10
	FailureRefill      = 6 * time.Second
	// FailuresOverall and OverallRefill bound wrong keys from every address
	// together (a guesser with many addresses). Past them every wrong key
	// is answered 429 too; a right key never is.
	FailuresOverall = 60
	OverallRefill   = time.Second
	// SignInsPerAddress bounds the sign-in forms of one client address
	// being read at once: one address trickling forms holds no more
	// connections than that. There is no bound over all addresses: slow
	// forms from many addresses would fill it before any key is read, and
	// refuse an operator at an address of their own (the connection cap
	// and its reserve bound the connections).
	SignInsPerAddress = 4
	// SignInFormBytes bounds a sign-in form (a key is some 50 bytes), and
	// SignInReadTimeout is how long it may take to arrive once its headers
	// have: a browser sends it in one go.
	SignInFormBytes   = 4 << 10
	SignInReadTimeout = 2 * time.Second
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

// take takes a token from b if it holds one, and otherwise reports how
// long until it does.
func (b *bucket) take(now time.Time, burst int, every time.Duration) (bool, time.Duration) {
	if b.level(now, burst, every) < 1 {
		return false, time.Duration((1 - b.tokens) * float64(every))
	}
	b.tokens--
	return true, 0
}

// guard counts failed authentications per client address and overall,
// and the sign-in forms being read.
type guard struct {
	mu      sync.Mutex
	byAddr  map[string]*bucket
	overall bucket
	signIns map[string]int
}

func newGuard() *guard {
	return &guard{byAddr: map[string]*bucket{}, signIns: map[string]int{}}
}

// failed counts a wrong key from addr. It reports whether addr, or every
// address together, was past its budget: the answer is then 429, with
// Retry-After wait. A failure past a budget takes nothing more from it, so
// the budget is whole again one refill after the flood ends, and a failure
// past its address's budget takes nothing from everyone's.
func (g *guard) failed(addr string) (throttled bool, wait time.Duration) {
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
	if ok, wait := b.take(now, FailuresPerAddress, FailureRefill); !ok {
		return true, wait // one address cannot empty everyone's budget
	}
	ok, wait := g.overall.take(now, FailuresOverall, OverallRefill)
	return !ok, wait
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

// signIn takes one of addr's slots to read a sign-in form; the release
// function gives it back.
func (g *guard) signIn(addr string) (release func(), ok bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.signIns[addr] >= SignInsPerAddress {
		return nil, false
	}
	g.signIns[addr]++
	return func() {
		g.mu.Lock()
		defer g.mu.Unlock()
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
			a, ok := forwardedAddr(fwd[i])
			if !ok {
				break
			}
			ip = a
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

// forwardedAddr parses one X-Forwarded-For entry: an address, or, as
// some proxies write it, an address and a port (192.0.2.1:4711,
// [2001:db8::1]:443), or a bracketed IPv6 address. (An entry with a port
// used to be unreadable, and every client behind the proxy counted as
// the proxy: one bucket of wrong keys for all of them.)
func forwardedAddr(entry string) (netip.Addr, bool) {
	entry = strings.TrimSpace(entry)
	if a, err := netip.ParseAddr(entry); err == nil {
		return a.Unmap(), true
	}
	if ap, err := netip.ParseAddrPort(entry); err == nil {
		return ap.Addr().Unmap(), true
	}
	if inner, ok := strings.CutPrefix(entry, "["); ok {
		if a, err := netip.ParseAddr(strings.TrimSuffix(inner, "]")); err == nil && strings.HasSuffix(inner, "]") {
			return a.Unmap(), true
		}
	}
	return netip.Addr{}, false
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
