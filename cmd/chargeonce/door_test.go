package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce/admin"
	"github.com/chargeonce/chargeonce/internal/apitest"
)

// clientFrom is an HTTP client whose connections come from the loopback
// address local (Linux routes all of 127.0.0.0/8 to lo), so that one test
// can be many client addresses. It follows no redirect.
func clientFrom(local string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}, Timeout: 5 * time.Second}
	return &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{DialContext: d.DialContext, MaxIdleConnsPerHost: 2},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// send does one request with c and returns its status (0 when it failed).
func send(c *http.Client, method, u, bearerKey, form string) int {
	var body io.Reader
	if form != "" {
		body = strings.NewReader(form)
	}
	req, err := http.NewRequest(method, u, body)
	if err != nil {
		return 0
	}
	if bearerKey != "" {
		req.Header.Set("Authorization", "Bearer "+bearerKey)
	}
	if form != "" {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// statusCounts counts answers by status, safe for concurrent use.
type statusCounts struct {
	mu sync.Mutex
	by map[int]int
}

func (s *statusCounts) add(status int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.by == nil {
		s.by = map[int]int{}
	}
	s.by[status]++
}

func (s *statusCounts) get(status int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.by[status]
}

func (s *statusCounts) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return fmt.Sprint(s.by)
}

// TestWrongKeysNeverLockOperatorsOut reproduces issue 48's item 2 against
// a real serve: 20 client addresses send wrong keys (bearer keys to the
// admin API and the merchant API, sign-in forms) without pause, past every
// wrong-key budget, while operators send the right keys from addresses of
// their own: one that signed in before the flood, one that never did. The
// server is restarted in the middle, the flood going on. Every right key
// is accepted, before and after the restart: the admin API 200, the
// sign-in 303, the merchant API 200. (The old guard checked the overall
// budget before the key: only addresses in its in-memory list of recent
// sign-ins got through, and after a restart none.)
func TestWrongKeysNeverLockOperatorsOut(t *testing.T) {
	t.Parallel()
	apiAddr, adminAddr := freeAddr(t), freeAddr(t)
	db := "sqlite:" + filepath.Join(t.TempDir(), "c.db")
	args := []string{"--admin-addr", adminAddr, "--db", db}
	r := startServe(t, apiAddr, args...)
	adminURL, apiURL := "http://"+adminAddr, "http://"+apiAddr
	signInForm := func(key string) string { return url.Values{"key": {key}}.Encode() }

	known := clientFrom("127.0.0.200")
	if st := send(known, "POST", adminURL+"/admin/login", "", signInForm("ak_test_demo")); st != http.StatusSeeOther {
		t.Fatalf("the operator's sign-in before the flood: %d", st)
	}

	// The flood: 20 addresses, each a wrong key every 10 ms, round-robin
	// over the admin API, the sign-in form and the merchant API.
	var adminFlood, signInFlood, apiFlood statusCounts
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var seq atomic.Int64
	for i := range 20 {
		c := clientFrom(fmt.Sprintf("127.0.0.%d", 10+i))
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				case <-time.After(10 * time.Millisecond):
				}
				n := seq.Add(1)
				wrong := fmt.Sprintf("ak_wrong_%d", n)
				switch n % 3 {
				case 0:
					adminFlood.add(send(c, "GET", adminURL+"/admin/v1/charges", wrong, ""))
				case 1:
					signInFlood.add(send(c, "POST", adminURL+"/admin/login", "", signInForm(wrong)))
				case 2:
					apiFlood.add(send(c, "GET", apiURL+"/v1/charges", "sk_wrong_"+wrong, ""))
				}
			}
		})
	}
	defer func() {
		close(stop)
		wg.Wait()
	}()

	// phase waits until the flood is past the budgets (wrong keys answered
	// 429), then has each operator send the right keys 16 times.
	phase := func(name string, operators map[string]*http.Client) (accepted, sent int) {
		t.Helper()
		before := adminFlood.get(429) + signInFlood.get(429)
		deadline := time.Now().Add(30 * time.Second)
		for adminFlood.get(429)+signInFlood.get(429) < before+20 {
			if time.Now().After(deadline) {
				t.Fatalf("%s: the flood was not refused 429 within 30 s: admin %s, sign-in %s", name, &adminFlood, &signInFlood)
			}
			time.Sleep(50 * time.Millisecond)
		}
		for who, c := range operators {
			var adminAPI, signIn, api statusCounts
			for range 16 {
				adminAPI.add(send(c, "GET", adminURL+"/admin/v1/charges", "ak_test_demo", ""))
				signIn.add(send(c, "POST", adminURL+"/admin/login", "", signInForm("ak_test_demo")))
				api.add(send(c, "GET", apiURL+"/v1/charges", "sk_test_demo", ""))
				time.Sleep(50 * time.Millisecond)
			}
			got := adminAPI.get(200) + signIn.get(303) + api.get(200)
			accepted += got
			sent += 48
			t.Logf("%s, operator at %s: admin API %s, sign-in %s, merchant API %s: %d of 48 accepted", name, who, &adminAPI, &signIn, &api, got)
			if adminAPI.get(200) != 16 || signIn.get(303) != 16 || api.get(200) != 16 {
				t.Errorf("%s, operator at %s: admin API %s, sign-in %s, merchant API %s; want every right key accepted (200, 303, 200)",
					name, who, &adminAPI, &signIn, &api)
			}
		}
		t.Logf("%s: the flood so far: admin API %s, sign-in %s, merchant API %s", name, &adminFlood, &signInFlood, &apiFlood)
		return accepted, sent
	}

	a1, s1 := phase("before the restart", map[string]*http.Client{"127.0.0.200 (signed in before)": known, "127.0.0.201 (new)": clientFrom("127.0.0.201")})
	if err := r.stop(); err != nil {
		t.Fatalf("stopping serve: %v", err)
	}
	startServe(t, apiAddr, args...)
	known.CloseIdleConnections()
	a2, s2 := phase("after the restart", map[string]*http.Client{"127.0.0.200 (signed in before)": known, "127.0.0.202 (new)": clientFrom("127.0.0.202")})
	t.Logf("right keys accepted during the flood: %d of %d before the restart, %d of %d after", a1, s1, a2, s2)
}

// hostReq does one request to u with its Host header (and Origin, for a
// form) saying host, as a page on a rebound DNS name would send it.
func hostReq(t *testing.T, method, u, host, bearerKey, form string) int {
	t.Helper()
	var body io.Reader
	if form != "" {
		body = strings.NewReader(form)
	}
	req, err := http.NewRequestWithContext(t.Context(), method, u, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = host
	if bearerKey != "" {
		req.Header.Set("Authorization", "Bearer "+bearerKey)
	}
	if form != "" {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Origin", "http://"+host)
	}
	c := &http.Client{Timeout: 10 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s (Host %s): %v", method, u, host, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// TestDemoKeysAnswerOnlyLoopbackHosts reproduces issue 48's item 5: with
// a DNS name rebound to 127.0.0.1, a page in the operator's browser sent
// Host: rebind.attacker.example and the public demo keys worked: the
// admin API answered 200, the sign-in 303, the merchant API 200 (and the
// simulator's unauthenticated /acquirer/ API 200). The demo keys, and the
// simulator mounted beside them, answer only loopback Host names:
// localhost, 127.0.0.1 and [::1], with any port.
func TestDemoKeysAnswerOnlyLoopbackHosts(t *testing.T) {
	t.Parallel()
	adminAddr := freeAddr(t)
	r := startServe(t, "127.0.0.1:0", "--admin-addr", adminAddr)
	_, apiPort, _ := net.SplitHostPort(strings.TrimPrefix(r.base, "http://"))
	_, adminPort, _ := net.SplitHostPort(adminAddr)
	form := url.Values{"key": {"ak_test_demo"}}.Encode()
	for _, host := range []string{"rebind.attacker.example", "localhost.attacker.example", "127.0.0.1.nip.io", "LOCALHOST.example"} {
		if st := hostReq(t, "GET", "http://"+adminAddr+"/admin/v1/charges", host+":"+adminPort, "ak_test_demo", ""); st != http.StatusUnauthorized {
			t.Errorf("Host %s: the admin API with ak_test_demo answered %d; want 401", host, st)
		}
		if st := hostReq(t, "POST", "http://"+adminAddr+"/admin/login", host+":"+adminPort, "", form); st == http.StatusSeeOther || st < 400 {
			t.Errorf("Host %s: the sign-in with ak_test_demo answered %d; want it refused", host, st)
		}
		if st := hostReq(t, "GET", r.base+"/v1/charges", host+":"+apiPort, "sk_test_demo", ""); st != http.StatusUnauthorized {
			t.Errorf("Host %s: the merchant API with sk_test_demo answered %d; want 401", host, st)
		}
		if st := hostReq(t, "GET", r.base+"/acquirer/v1/stats", host+":"+apiPort, "", ""); st < 400 {
			t.Errorf("Host %s: the simulator's /acquirer/v1/stats answered %d; want it refused", host, st)
		}
	}
	for _, host := range []string{"localhost", "LocalHost", "127.0.0.1", "[::1]"} {
		for _, port := range []string{"", ":" + adminPort} {
			if st := hostReq(t, "GET", "http://"+adminAddr+"/admin/v1/charges", host+port, "ak_test_demo", ""); st != http.StatusOK {
				t.Errorf("Host %s%s: the admin API with ak_test_demo answered %d; want 200", host, port, st)
			}
			if st := hostReq(t, "POST", "http://"+adminAddr+"/admin/login", host+port, "", form); st != http.StatusSeeOther {
				t.Errorf("Host %s%s: the sign-in with ak_test_demo answered %d; want 303", host, port, st)
			}
		}
		if st := hostReq(t, "GET", r.base+"/v1/charges", host+":"+apiPort, "sk_test_demo", ""); st != http.StatusOK {
			t.Errorf("Host %s: the merchant API with sk_test_demo answered %d; want 200", host, st)
		}
		if st := hostReq(t, "GET", r.base+"/acquirer/v1/stats", host+":"+apiPort, "", ""); st != http.StatusOK {
			t.Errorf("Host %s: the simulator's /acquirer/v1/stats answered %d; want 200", host, st)
		}
	}
}

// TestAdminOffLoopbackWithoutTLS: issue 48's item 5 too: a non-loopback
// --admin-addr without --admin-tls-cert sends admin keys and session
// cookies in clear. serve refuses it at start, naming the flags, unless
// --admin-allow-plain-http says a proxy or a private network takes care of
// it; then it starts and says so in a warning.
func TestAdminOffLoopbackWithoutTLS(t *testing.T) {
	t.Parallel()
	_, line, err := admin.NewKey("alice")
	if err != nil {
		t.Fatal(err)
	}
	keys := filepath.Join(t.TempDir(), "admins")
	if err := os.WriteFile(keys, []byte(line+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// A serve that starts is stopped after a while (and the test fails).
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	err = Main(ctx, []string{"serve", "--db", "sqlite:" + filepath.Join(t.TempDir(), "c.db"), "--addr", "127.0.0.1:0",
		"--admin-addr", "0.0.0.0:0", "--admin-keys-file", keys}, &apitest.Buffer{}, &apitest.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "--admin-tls-cert") || !strings.Contains(err.Error(), "--admin-allow-plain-http") {
		t.Errorf("a non-loopback --admin-addr without TLS: %v; want a refusal naming --admin-tls-cert and --admin-allow-plain-http", err)
	}
	r := startServe(t, "127.0.0.1:0", "--admin-addr", "0.0.0.0:0", "--admin-keys-file", keys, "--admin-allow-plain-http")
	if l := r.stderr.String(); !strings.Contains(l, "level=WARN") || !strings.Contains(l, "--admin-allow-plain-http") {
		t.Errorf("serve with --admin-allow-plain-http logged no warning naming it:\n%s", l)
	}
	// On loopback, plain HTTP needs no flag.
	startServe(t, "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--admin-keys-file", keys)
}
