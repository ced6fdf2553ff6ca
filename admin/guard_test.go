package admin_test

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/admin"
	"github.com/chargeonce/chargeonce/internal/apitest"
)

// newServer returns an admin server over an SQLite store, its log, for
// requests served in-process (each with the client address a test gives).
func newServer(t *testing.T, proxies ...netip.Prefix) (*admin.Server, *apitest.Buffer) {
	t.Helper()
	logs := &apitest.Buffer{}
	srv, err := admin.New(admin.Config{Store: apitest.Store(t, "sqlite"), Acquirer: apitest.Simulator(t, acquirer.Options{}),
		Keys: adminKeys(t), Logger: newLogger(logs), TrustedProxies: proxies})
	if err != nil {
		t.Fatal(err)
	}
	return srv, logs
}

// from serves r as if it came from addr.
func from(srv http.Handler, addr string, r *http.Request) *httptest.ResponseRecorder {
	r.RemoteAddr = addr + ":40000"
	w := httptest.NewRecorder()
	srv.ServeHTTP(w, r)
	return w
}

func bearerReq(key string) *http.Request {
	r := httptest.NewRequest(http.MethodGet, "/admin/v1/charges", nil)
	r.Header.Set("Authorization", "Bearer "+key)
	return r
}

func loginReq(key string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/admin/login", strings.NewReader(url.Values{"key": {key}}.Encode()))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	return r
}

// TestGuessingKeysIsLimited reproduces issue 34's item 6: 300 wrong
// bearer keys and 300 wrong sign-ins as fast as they go. Past
// FailuresPerAddress from one address, wrong keys are answered 429 with
// Retry-After and the address is logged; other addresses are not
// affected; past FailuresOverall from everywhere wrong keys are answered
// 429 too. A right key is always accepted (issue 48's item 2), from the
// guesser's address too, and a session is never refused.
func TestGuessingKeysIsLimited(t *testing.T) {
	t.Parallel()
	srv, logs := newServer(t)
	count := func(addr string, req func(i int) *http.Request) map[int]int {
		got := map[int]int{}
		for i := range 300 {
			w := from(srv, addr, req(i))
			got[w.Code]++
			if w.Code == http.StatusTooManyRequests {
				if ra, err := strconv.Atoi(w.Header().Get("Retry-After")); err != nil || ra < 1 {
					t.Fatalf("429 with Retry-After %q", w.Header().Get("Retry-After"))
				}
			}
		}
		return got
	}
	start := time.Now()
	bearers := count("192.0.2.1", func(i int) *http.Request { return bearerReq(fmt.Sprintf("ak_guess_%d", i)) })
	logins := count("192.0.2.2", func(i int) *http.Request { return loginReq(fmt.Sprintf("ak_guess_%d", i)) })
	t.Logf("300 wrong bearer keys from one address: %v; 300 wrong sign-ins from another: %v; in %s", bearers, logins, time.Since(start).Round(time.Millisecond))
	for what, got := range map[string]map[int]int{"bearer keys": bearers, "sign-ins": logins} {
		if got[401] != admin.FailuresPerAddress || got[429] != 300-admin.FailuresPerAddress {
			t.Errorf("wrong %s: %v; want %d answered 401 and the rest 429", what, got, admin.FailuresPerAddress)
		}
	}
	// The right key is checked first: from a guesser's address too, it
	// is accepted.
	if w := from(srv, "192.0.2.1", bearerReq(aliceKey)); w.Code != 200 {
		t.Errorf("alice's key from the guesser's address: %d, want 200", w.Code)
	}
	// An operator elsewhere signs in, and keeps a session.
	w := from(srv, "198.51.100.7", loginReq(bobKey))
	if w.Code != http.StatusSeeOther || len(w.Result().Cookies()) != 1 {
		t.Fatalf("bob's sign-in from his own address: %d", w.Code)
	}
	cookie := w.Result().Cookies()[0]
	if w := from(srv, "198.51.100.7", bearerReq(aliceKey)); w.Code != 200 {
		t.Errorf("alice's key from another address: %d, want 200", w.Code)
	}
	// A guesser with many addresses, one wrong key each: past the overall
	// limit, answered 429.
	many := map[int]int{}
	for i := range 200 {
		many[from(srv, fmt.Sprintf("203.0.113.%d", i), bearerReq("ak_guess")).Code]++
	}
	t.Logf("200 wrong keys from 200 addresses: %v", many)
	if many[429] == 0 || many[401] > admin.FailuresOverall {
		t.Errorf("wrong keys from many addresses: %v; want at most %d answered 401, the rest 429", many, admin.FailuresOverall)
	}
	// Meanwhile the operators are not locked out, at an address that
	// signed in before or at a new one.
	for _, addr := range []string{"198.51.100.7", "198.51.100.8"} {
		if w := from(srv, addr, bearerReq(aliceKey)); w.Code != 200 {
			t.Errorf("alice's key from %s during the storm: %d, want 200", addr, w.Code)
		}
	}
	page := httptest.NewRequest(http.MethodGet, "/admin/", nil)
	page.AddCookie(cookie)
	if w := from(srv, "198.51.100.99", page); w.Code != 200 {
		t.Errorf("bob's session during the storm: %d, want 200", w.Code)
	}
	l := logs.String()
	for _, addr := range []string{"client=192.0.2.1", "client=192.0.2.2", "client=203.0.113.5"} {
		if !strings.Contains(l, addr) {
			t.Errorf("the log names no %s", addr)
		}
	}
	if !strings.Contains(l, `level=WARN msg="admin call refused"`) {
		t.Error("refused keys are not logged as warnings")
	}
}

// TestWeakKeys: keys under MinKeyBits are reported weak (serve refuses
// them), a digest of a one-character key too; NewKey's keys are strong and
// work.
func TestWeakKeys(t *testing.T) {
	t.Parallel()
	tiny := sha256.Sum256([]byte("b"))
	k, err := admin.ParseKeys("one:a\nshort:ak_test_alice\ndigest:sha256:" + hex.EncodeToString(tiny[:]) +
		"\nhex:0123456789abcdef0123456789abcdef\nopaque:sha256:" + sha256hex("whatever") + "\n")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(k.Weak(), ","); got != "one,short,digest" {
		t.Errorf("weak: %s; want one,short,digest", got)
	}
	key, line, err := admin.NewKey("carol")
	if err != nil {
		t.Fatal(err)
	}
	bits := admin.EstimateBits(key)
	t.Logf("a new key: %d characters, about %.0f bits estimated", len(key), bits)
	if bits < admin.MinKeyBits {
		t.Errorf("NewKey's key estimated at %.0f bits", bits)
	}
	nk, err := admin.ParseKeys(line)
	if err != nil || len(nk.Weak()) != 0 {
		t.Fatalf("NewKey's line %q: %v, weak %v", line, err, nk.Weak())
	}
	srv, err := admin.New(admin.Config{Store: apitest.Store(t, "sqlite"), Acquirer: apitest.Simulator(t, acquirer.Options{}), Keys: nk})
	if err != nil {
		t.Fatal(err)
	}
	if w := from(srv, "192.0.2.9", bearerReq(key)); w.Code != 200 {
		t.Errorf("NewKey's key: %d", w.Code)
	}
}

// TestBehindATLSProxy reproduces issue 34's item 5: behind a proxy that
// terminates TLS, sign-in was refused (the origin check built http://+Host)
// and the cookie was never Secure. A trusted proxy's X-Forwarded-Proto
// counts; an untrusted peer's does not.
func TestBehindATLSProxy(t *testing.T) {
	t.Parallel()
	signIn := func(srv http.Handler, peer string) *httptest.ResponseRecorder {
		r := loginReq(aliceKey)
		r.Host = "ops.example.com"
		r.Header.Set("Origin", "https://ops.example.com")
		r.Header.Set("Sec-Fetch-Site", "same-origin")
		r.Header.Set("X-Forwarded-Proto", "https")
		r.Header.Set("X-Forwarded-For", "198.51.100.20")
		return from(srv, peer, r)
	}
	trusting, logs := newServer(t, netip.MustParsePrefix("10.0.0.0/8"))
	w := signIn(trusting, "10.1.2.3")
	if w.Code != http.StatusSeeOther || len(w.Result().Cookies()) != 1 || !w.Result().Cookies()[0].Secure {
		t.Errorf("sign-in through a trusted TLS proxy: %d, cookies %v; want 303 and a Secure cookie", w.Code, w.Result().Cookies())
	}
	if !strings.Contains(logs.String(), "client=198.51.100.20") {
		t.Errorf("the log does not name the client behind the proxy:\n%s", logs.String())
	}
	// The same headers from a peer not trusted: the scheme is http, the
	// origin https, and the sign-in is refused as cross-site.
	if w := signIn(trusting, "192.0.2.50"); w.Code != http.StatusForbidden {
		t.Errorf("X-Forwarded-Proto from an untrusted peer: %d, want 403", w.Code)
	}
	plain, _ := newServer(t)
	if w := signIn(plain, "10.1.2.3"); w.Code != http.StatusForbidden {
		t.Errorf("no trusted proxies configured: %d, want 403", w.Code)
	}
}

// TestRightKeysThroughAWrongKeyFlood reproduces issue 48's item 2 in
// process: wrong keys from 300 addresses empty every budget, and then the
// right keys, from addresses that never signed in and from a guesser's own
// address, are all accepted: bearer keys 200, sign-ins 303. The same after
// a restart (a new Server on the same store), where nothing is remembered.
func TestRightKeysThroughAWrongKeyFlood(t *testing.T) {
	t.Parallel()
	store := apitest.Store(t, "sqlite")
	sim := apitest.Simulator(t, acquirer.Options{})
	for _, run := range []string{"before the restart", "after the restart"} {
		srv, err := admin.New(admin.Config{Store: store, Acquirer: sim, Keys: adminKeys(t)})
		if err != nil {
			t.Fatal(err)
		}
		flood := map[int]int{}
		for i := range 300 {
			addr := fmt.Sprintf("203.0.113.%d", i%250)
			flood[from(srv, addr, bearerReq(fmt.Sprintf("ak_guess_%d", i))).Code]++
			flood[from(srv, addr, loginReq(fmt.Sprintf("ak_guess_%d", i))).Code]++
		}
		right := map[int]int{}
		for i := range 20 {
			addr := fmt.Sprintf("198.51.100.%d", i)
			if i%4 == 0 {
				addr = "203.0.113.7" // a guesser's own address
			}
			right[from(srv, addr, bearerReq(aliceKey)).Code]++
			right[from(srv, addr, loginReq(bobKey)).Code]++
			flood[from(srv, fmt.Sprintf("203.0.113.%d", i), bearerReq("ak_guess")).Code]++
		}
		t.Logf("%s: 640 wrong keys: %v; 40 right keys: %v", run, flood, right)
		if flood[429] == 0 {
			t.Errorf("%s: no wrong key of the flood was answered 429: %v", run, flood)
		}
		if right[200] != 20 || right[303] != 20 {
			t.Errorf("%s: the right keys during the flood: %v; want 20 answered 200 and 20 answered 303", run, right)
		}
	}
}

// TestForwardedForWithAPort reproduces issue 48's item 2's proxies: an
// X-Forwarded-For entry with a port (192.0.2.1:4711, [2001:db8::1]:443),
// as some proxies write it, fell back to the proxy's own address, so
// every client behind the proxy shared one bucket of wrong keys. The
// client is the address before the port.
func TestForwardedForWithAPort(t *testing.T) {
	t.Parallel()
	srv, logs := newServer(t, netip.MustParsePrefix("10.0.0.0/8"))
	via := func(xff, key string) int {
		r := bearerReq(key)
		r.Header.Set("X-Forwarded-For", xff)
		return from(srv, "10.0.0.2", r).Code
	}
	for i := range admin.FailuresPerAddress + 5 {
		via("192.0.2.1:4711", fmt.Sprintf("ak_guess_%d", i))
	}
	if got := via("192.0.2.1:4711", "ak_guess"); got != http.StatusTooManyRequests {
		t.Errorf("a wrong key from the guesser behind the proxy: %d, want 429", got)
	}
	for _, xff := range []string{"192.0.2.2:4711", "[2001:db8::1]:443", "198.51.100.3, 192.0.2.3:80"} {
		if got := via(xff, "ak_guess_other"); got != http.StatusUnauthorized {
			t.Errorf("a wrong key from another client behind the proxy (X-Forwarded-For %s): %d, want 401 (its own bucket)", xff, got)
		}
	}
	l := logs.String()
	for _, client := range []string{"192.0.2.1", "192.0.2.2", "2001:db8::/64", "192.0.2.3"} {
		if !regexp.MustCompile(`client=` + regexp.QuoteMeta(client) + `(\s|$)`).MatchString(l) {
			t.Errorf("the log names no client=%s", client)
		}
	}
	if strings.Contains(l, "client=10.0.0.2") {
		t.Error("the log names the proxy as the client")
	}
}

// TestSignInFormBounded: a sign-in form larger than SignInFormBytes is
// answered 400 and its connection closed, without its key being read.
func TestSignInFormBounded(t *testing.T) {
	t.Parallel()
	srv, _ := newServer(t)
	big := loginReq(bobKey + strings.Repeat("x", admin.SignInFormBytes))
	if w := from(srv, "192.0.2.30", big); w.Code != http.StatusBadRequest || w.Header().Get("Connection") != "close" {
		t.Errorf("a %d-byte sign-in form: %d, Connection %q; want 400 and close", big.ContentLength, w.Code, w.Header().Get("Connection"))
	}
	big = loginReq(bobKey + "&pad=" + strings.Repeat("x", admin.SignInFormBytes))
	big.ContentLength = -1 // sent chunked: the bound holds as it is read
	if w := from(srv, "192.0.2.30", big); w.Code != http.StatusBadRequest {
		t.Errorf("a chunked sign-in form past %d bytes: %d; want 400", admin.SignInFormBytes, w.Code)
	}
	if w := from(srv, "192.0.2.30", loginReq(bobKey)); w.Code != http.StatusSeeOther {
		t.Errorf("bob's sign-in after them: %d, want 303", w.Code)
	}
}
