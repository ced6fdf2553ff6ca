package admin

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"net/http"
	"sync"
	"time"
)

// sessionCookie names the console's session cookie. It holds a random
// session id, never the admin key; the server keeps the rest.
const sessionCookie = "chargeonce_admin"

// maxSessions bounds the sessions held at once; the oldest goes first.
const maxSessions = 10000

// session is one console login.
type session struct {
	admin   string
	csrf    string
	expires time.Time
}

// sessions holds console sessions in memory, by the digest of their id (a
// memory dump shows no usable cookie). A session lives on the instance
// that made it: behind a load balancer the console needs sticky sessions,
// while the JSON API needs none.
type sessions struct {
	ttl time.Duration
	mu  sync.Mutex
	m   map[[sha256.Size]byte]*session
}

func newSessions(ttl time.Duration) *sessions {
	return &sessions{ttl: ttl, m: map[[sha256.Size]byte]*session{}}
}

func randomToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// create starts a session for admin and returns its id.
func (ss *sessions) create(admin string) (id string, s *session) {
	id = randomToken()
	s = &session{admin: admin, csrf: randomToken(), expires: time.Now().Add(ss.ttl)}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	now := time.Now()
	for k, v := range ss.m {
		if now.After(v.expires) || len(ss.m) >= maxSessions {
			delete(ss.m, k)
		}
	}
	ss.m[sha256.Sum256([]byte(id))] = s
	return id, s
}

// get returns the live session of r, if any.
func (ss *sessions) get(r *http.Request) (*session, bool) {
	c, err := r.Cookie(sessionCookie)
	if err != nil || c.Value == "" {
		return nil, false
	}
	k := sha256.Sum256([]byte(c.Value))
	ss.mu.Lock()
	defer ss.mu.Unlock()
	s, ok := ss.m[k]
	if !ok {
		return nil, false
	}
	if time.Now().After(s.expires) {
		delete(ss.m, k)
		return nil, false
	}
	return s, true
}

// end forgets r's session.
func (ss *sessions) end(r *http.Request) {
	if c, err := r.Cookie(sessionCookie); err == nil {
		ss.mu.Lock()
		delete(ss.m, sha256.Sum256([]byte(c.Value)))
		ss.mu.Unlock()
	}
}

// csrfOK reports whether the form's token is the session's.
func (s *session) csrfOK(r *http.Request) bool {
	got := r.PostFormValue("csrf")
	return got != "" && subtle.ConstantTimeCompare([]byte(got), []byte(s.csrf)) == 1
}

// sameOrigin refuses a cross-site form post: browsers send Sec-Fetch-Site
// (and Origin) with every POST, and a page of another site cannot forge
// them. A client that sends neither (curl) is let through to the CSRF
// token check. The origin's scheme is https when the browser speaks HTTPS
// to us or to a trusted proxy in front (X-Forwarded-Proto).
func (s *Server) sameOrigin(r *http.Request) bool {
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" && site != "none" {
		return false
	}
	if o := r.Header.Get("Origin"); o != "" && o != "null" {
		scheme := "http://"
		if s.secure(r) {
			scheme = "https://"
		}
		return o == scheme+r.Host
	}
	return true
}
