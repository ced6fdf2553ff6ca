package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/internal/apitest"
)

// running is a serve command started by startServe.
type running struct {
	base   string
	stderr *apitest.Buffer
	stop   func() error
}

// startServe runs `chargeonce serve` with args (plus an SQLite --db unless
// args name one) until the test ends, and waits until it is ready on addr.
func startServe(t *testing.T, addr string, args ...string) *running {
	t.Helper()
	if !contains(args, "--db") {
		args = append(args, "--db", "sqlite:"+filepath.Join(t.TempDir(), "c.db"))
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{stderr: &apitest.Buffer{}}
	done := make(chan error, 1)
	go func() {
		done <- Main(ctx, append([]string{"serve", "--addr", addr}, args...), &apitest.Buffer{}, r.stderr)
	}()
	host, port, _ := net.SplitHostPort(addr)
	if host == "0.0.0.0" || host == "" || host == "::" {
		host = "127.0.0.1"
	}
	r.base = "http://" + net.JoinHostPort(host, port)
	// Port 0: the port serve got is in its "chargeonce listening" line. (A
	// port probed free beforehand can be taken, by an outgoing connection
	// of another test, before serve binds it.)
	listening := regexp.MustCompile(`msg="chargeonce listening" addr=\S*:(\d+)`)
	stopped := false
	r.stop = func() error {
		if stopped {
			return nil
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			return err
		case <-time.After(15 * time.Second):
			t.Fatalf("serve did not stop")
			return nil
		}
	}
	t.Cleanup(func() { _ = r.stop() })
	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case err := <-done:
			stopped = true
			t.Fatalf("serve %v exited: %v\n%s", args, err, r.stderr.String())
		default:
		}
		if port == "0" {
			m := listening.FindStringSubmatch(r.stderr.String())
			if m == nil {
				if time.Now().After(deadline) {
					t.Fatalf("serve %v logged no listening address after 10s\n%s", args, r.stderr.String())
				}
				time.Sleep(20 * time.Millisecond)
				continue
			}
			port = m[1]
			r.base = "http://" + net.JoinHostPort(host, port)
		}
		if resp, err := http.Get(r.base + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return r
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("serve %v not ready after 10s\n%s", args, r.stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func contains(args []string, flag string) bool {
	for _, a := range args {
		if a == flag {
			return true
		}
	}
	return false
}

// get sends a GET with the given bearer key ("" for none).
func get(t *testing.T, url, key string) apitest.Result {
	t.Helper()
	r, err := apitest.Do(t, nil, "GET", url, nil, map[string]string{"Authorization": bearer(key)})
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return r
}

func bearer(key string) string {
	if key == "" {
		return ""
	}
	return "Bearer " + key
}

func chargeWith(t *testing.T, base, apiKey, key string) apitest.Result {
	t.Helper()
	r, err := apitest.Do(t, nil, "POST", base+"/v1/charges", []byte(`{"order_id": 7, "amount_cents": 100, "payment_token": "tok_ok"}`),
		map[string]string{"Authorization": bearer(apiKey), "Idempotency-Key": key})
	if err != nil {
		t.Fatalf("POST /v1/charges: %v", err)
	}
	return r
}

// TestSimulatorRefusedOffLoopback: the in-process simulator "captures"
// without moving money and serves /acquirer/ unauthenticated, so serve
// refuses it on a non-loopback --addr, naming the flags, even with real API
// keys; with a remote acquirer the same address is fine, and nothing is
// mounted under /acquirer/.
func TestSimulatorRefusedOffLoopback(t *testing.T) {
	t.Parallel()
	db := "sqlite:" + filepath.Join(t.TempDir(), "c.db")
	for _, args := range [][]string{
		{"serve", "--db", db, "--addr", "0.0.0.0:0", "--api-keys", "acme:sk_live_x"},
		{"serve", "--db", db, "--addr", ":0", "--api-keys", "acme:sk_live_x", "--acquirer", "sim"},
		{"serve", "--db", db, "--addr", "[::]:0", "--api-keys", "acme:sk_live_x"},
	} {
		// Bounded: a serve that does not refuse would run until cancelled.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := Main(ctx, args, &apitest.Buffer{}, &apitest.Buffer{})
		cancel()
		if err == nil || !strings.Contains(err.Error(), "--acquirer") || !strings.Contains(err.Error(), "--addr") || !strings.Contains(err.Error(), "chargeonce acquirer") {
			t.Errorf("%v: error %v, want a refusal naming --acquirer, --addr and chargeonce acquirer", args, err)
		}
	}

	acq := startSimulatorServer(t)
	r := startServe(t, "0.0.0.0:0", "--api-keys", "acme:sk_live_x", "--acquirer", acq)
	if c := chargeWith(t, r.base, "sk_live_x", "remote-1"); c.Status != 201 {
		t.Fatalf("charge through a remote acquirer on 0.0.0.0: %d %s", c.Status, c.Body)
	}
	if got := get(t, r.base+"/acquirer/v1/stats", ""); got.Status != 404 {
		t.Fatalf("/acquirer/ answered %d without an in-process simulator: %s", got.Status, got.Body)
	}
}

// TestSimulatorMountedOnlyOnLoopback checks the mount itself, apart from the
// refusal that normally keeps a simulator off a public address.
func TestSimulatorMountedOnlyOnLoopback(t *testing.T) {
	t.Parallel()
	sim := apitest.Simulator(t, acquirer.Options{})
	api := http.NotFoundHandler()
	for addr, mounted := range map[string]bool{
		"127.0.0.1:8080": true, "localhost:8080": true, "[::1]:8080": true,
		"0.0.0.0:8080": false, ":8080": false, "10.0.0.5:8080": false, "[::]:8080": false,
	} {
		h := withSimulator(api, sim, addr)
		rec := &recorder{header: http.Header{}}
		req, _ := http.NewRequest("GET", "http://localhost:8080/acquirer/v1/stats", nil)
		h.ServeHTTP(rec, req)
		if got := rec.status == 200; got != mounted {
			t.Errorf("--addr %s: /acquirer/v1/stats answered %d; mounted=%v, want %v", addr, rec.status, got, mounted)
		}
	}
}

type recorder struct {
	header http.Header
	status int
}

func (r *recorder) Header() http.Header { return r.header }
func (r *recorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = 200
	}
	return len(b), nil
}
func (r *recorder) WriteHeader(s int) { r.status = s }

// startSimulatorServer runs a stand-alone simulator and returns its URL.
func startSimulatorServer(t *testing.T) string {
	t.Helper()
	sim := apitest.Simulator(t, acquirer.Options{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: acquirer.Handler(sim)}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String()
}

// TestAPIKeysFile: keys come from a file, in clear or as SHA-256 digests,
// with comments; the demo key is then refused, and no secret reaches the
// log.
func TestAPIKeysFile(t *testing.T) {
	t.Parallel()
	digest := sha256.Sum256([]byte("sk_live_hashed_secret"))
	path := filepath.Join(t.TempDir(), "keys")
	content := "# chargeonce API keys\n" +
		"acme:sk_live_plain_secret\n" +
		"\n" +
		"shop:sha256:" + hex.EncodeToString(digest[:]) + "  # digest only\n"
	// A trailing comment is not a comment: the digest line above must fail.
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	err := Main(context.Background(), []string{"serve", "--db", "sqlite:" + filepath.Join(t.TempDir(), "c.db"), "--addr", freeAddr(t), "--api-keys-file", path}, &apitest.Buffer{}, &apitest.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "--api-keys-file") || strings.Contains(err.Error(), "sk_live") {
		t.Fatalf("a malformed digest line: error %v, want one naming --api-keys-file without any secret", err)
	}

	content = strings.Replace(content, "  # digest only", "", 1)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	r := startServe(t, "127.0.0.1:0", "--api-keys-file", path)
	for apiKey, want := range map[string]int{
		"sk_live_plain_secret":                    201,
		"sk_live_hashed_secret":                   201,
		"sk_test_demo":                            401,
		hex.EncodeToString(digest[:]):             401,
		"sha256:" + hex.EncodeToString(digest[:]): 401,
	} {
		if c := chargeWith(t, r.base, apiKey, "file-"+apiKey[:10]); c.Status != want {
			t.Errorf("API key %s: status %d, want %d (%s)", apiKey, c.Status, want, c.Body)
		}
	}
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	if log := r.stderr.String(); strings.Contains(log, "sk_live") || strings.Contains(log, hex.EncodeToString(digest[:])) || strings.Contains(log, "demo merchant") {
		t.Fatalf("the log shows a secret or claims the demo key:\n%s", log)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--api-keys-file", filepath.Join(t.TempDir(), "missing")}, "--api-keys-file"},
		{[]string{"--api-keys-file", path, "--api-keys", "a:b"}, "not both"},
	} {
		args := append([]string{"serve", "--db", "sqlite:" + filepath.Join(t.TempDir(), "c.db"), "--addr", freeAddr(t)}, tc.args...)
		if err := Main(context.Background(), args, &apitest.Buffer{}, &apitest.Buffer{}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want one containing %q", tc.args, err, tc.want)
		}
	}
}

// TestMerchantRates: serve refuses a merchant's attempts past its rate
// with 429 rate-limited, the default from --merchant-rate and
// --merchant-burst, a merchant's own from a rate line in the keys file.
func TestMerchantRates(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(path, []byte("acme:sk_live_acme\nshop:sk_live_shop\nrate shop 1/h burst 4\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := startServe(t, "127.0.0.1:0", "--api-keys-file", path, "--merchant-rate", "1/m", "--merchant-burst", "2")
	for merchant, allowed := range map[string]int{"acme": 2, "shop": 4} {
		for i := range allowed + 1 {
			want := 201
			if i == allowed {
				want = 429
			}
			c := chargeWith(t, r.base, "sk_live_"+merchant, fmt.Sprintf("rate-%s-%d", merchant, i))
			if c.Status != want {
				t.Fatalf("%s's attempt %d: status %d, want %d (%s)", merchant, i+1, c.Status, want, c.Body)
			}
			if want == 429 && c.Header.Get("Retry-After") == "" {
				t.Fatalf("%s's 429 has no Retry-After", merchant)
			}
		}
	}
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
}

// TestAPIKeysFileFromEnvironment: the file can be named by the environment
// twin, so the command line shows nothing at all.
func TestAPIKeysFileFromEnvironment(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(path, []byte("envm:sk_env_secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("CHARGEONCE_API_KEYS_FILE", path) // forbids t.Parallel
	r := startServe(t, "127.0.0.1:0")
	if c := chargeWith(t, r.base, "sk_env_secret", "env-1"); c.Status != 201 {
		t.Fatalf("charge with the key from CHARGEONCE_API_KEYS_FILE: %d %s", c.Status, c.Body)
	}
}

// TestMetricsAddr: with --metrics-addr, /metrics is served there and no
// longer on the API's address.
func TestMetricsAddr(t *testing.T) {
	t.Parallel()
	maddr := freeAddr(t)
	r := startServe(t, "127.0.0.1:0", "--metrics-addr", maddr)
	if c := chargeWith(t, r.base, "sk_test_demo", "metrics-1"); c.Status != 201 {
		t.Fatalf("charge: %d %s", c.Status, c.Body)
	}
	m := get(t, "http://"+maddr+"/metrics", "")
	if m.Status != 200 || !strings.Contains(string(m.Body), `chargeonce_charge_attempts_total{replayed="false",status="201"} 1`) {
		t.Fatalf("/metrics on --metrics-addr: %d\n%s", m.Status, m.Body)
	}
	// serve wires the operator's metrics: the pool it runs on, the
	// charge's admission, recovery's first pass.
	for _, want := range []string{
		"chargeonce_db_pool_max_connections ", "chargeonce_db_pool_waits_total ",
		`chargeonce_admission_wait_seconds_count{result="admitted"} 1`,
		`chargeonce_recovery_records_total{result="claimed"} `, "chargeonce_stuck_records 0",
	} {
		if !strings.Contains(string(m.Body), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if got := get(t, r.base+"/metrics", ""); got.Status != 404 {
		t.Fatalf("/metrics still served on --addr: %d", got.Status)
	}
	if got := get(t, "http://"+maddr+"/v1/charges?order_id=7", "sk_test_demo"); got.Status != 404 {
		t.Fatalf("the API is served on --metrics-addr: %d", got.Status)
	}
	if !strings.Contains(r.stderr.String(), `msg="metrics listening" addr=`+maddr) {
		t.Fatalf("serve did not log the metrics address:\n%s", r.stderr.String())
	}
}
