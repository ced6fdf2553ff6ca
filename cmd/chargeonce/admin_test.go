package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/internal/apitest"
)

// TestAdminAddrRefusals: the admin listener needs admin keys off loopback,
// and an admin key may not be a merchant's key too.
func TestAdminAddrRefusals(t *testing.T) {
	t.Parallel()
	merchantDigest := sha256.Sum256([]byte("sk_live_shared"))
	shared := filepath.Join(t.TempDir(), "admins")
	if err := os.WriteFile(shared, []byte("alice:sha256:"+hex.EncodeToString(merchantDigest[:])+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--admin-addr", "0.0.0.0:0"}, "--admin-keys-file is required"},
		{[]string{"--admin-addr", "127.0.0.1:0", "--api-keys", "acme:sk_live_shared", "--admin-keys-file", shared}, "also a merchant's API key"},
		{[]string{"--admin-addr", "127.0.0.1:0", "--admin-keys-file", filepath.Join(t.TempDir(), "missing")}, "--admin-keys-file"},
	} {
		args := append([]string{"serve", "--db", "sqlite:" + filepath.Join(t.TempDir(), "c.db"), "--addr", "127.0.0.1:0"}, tc.args...)
		err := Main(context.Background(), args, &apitest.Buffer{}, &apitest.Buffer{})
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "sk_live") {
			t.Errorf("%v: error %v, want one containing %q and no secret", tc.args, err, tc.want)
		}
	}
}

// TestResolveCommand: serve with --admin-addr, a charge whose capture
// happened but whose reply was lost (202, processing), then `chargeonce
// resolve`: declining it is refused because the acquirer holds the
// capture; settling it as captured works, is audited under the admin's
// name, and the merchant's retry replays it. A manual-capture charge whose
// authorization's reply was lost is refused captured and resolved
// authorized, and its retry replays the authorization.
func TestResolveCommand(t *testing.T) {
	t.Parallel()
	r := startServe(t, "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--reconcile-every", "1h")
	m := regexp.MustCompile(`msg="admin listening" addr=(\S+)`).FindStringSubmatch(r.stderr.String())
	if m == nil {
		t.Fatalf("serve logged no admin address:\n%s", r.stderr.String())
	}
	adminURL := "http://" + m[1]
	if _, _, err := net.SplitHostPort(m[1]); err != nil {
		t.Fatal(err)
	}
	body := []byte(`{"order_id": 9, "amount_cents": 700, "payment_token": "tok_fail_after"}`)
	c, err := apitest.Do(t, nil, "POST", r.base+"/v1/charges", body, map[string]string{"Idempotency-Key": "lost-reply"})
	if err != nil || c.Status != 202 {
		t.Fatalf("tok_fail_after: %d %s (%v)", c.Status, c.Body, err)
	}
	var ch struct{ ID string }
	_ = json.Unmarshal(c.Body, &ch)
	keyFile := filepath.Join(t.TempDir(), "admin-key")
	if err := os.WriteFile(keyFile, []byte("ak_test_demo\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	resolve := func(args ...string) (string, string, error) {
		var out, errb bytes.Buffer
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		err := Main(ctx, append([]string{"resolve", ch.ID, "--admin-url", adminURL, "--admin-key-file", keyFile}, args...), &out, &errb)
		return out.String(), errb.String(), err
	}
	_, stderr, err := resolve("--status", "declined", "--reason", "the customer called")
	if err == nil || !strings.Contains(stderr, "Acquirer disagrees") || !strings.Contains(stderr, "found: captured") {
		t.Fatalf("declining a captured charge: %v\n%s", err, stderr)
	}
	out, stderr, err := resolve("--status", "captured", "--reason", "support ticket 9")
	if err != nil || !strings.Contains(out, `"status": "captured"`) || !strings.Contains(out, `"actor": "admin:operator"`) {
		t.Fatalf("resolve captured: %v\n%s\n%s", err, out, stderr)
	}
	if _, stderr, err := resolve("--status", "captured", "--reason", "again"); err == nil || !strings.Contains(stderr, "Charge not processing") {
		t.Fatalf("resolving again: %v %s", err, stderr)
	}
	c, err = apitest.Do(t, nil, "POST", r.base+"/v1/charges", body, map[string]string{"Idempotency-Key": "lost-reply"})
	if err != nil || c.Status != 201 || c.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry after the resolution: %d %s (%v)", c.Status, c.Body, err)
	}

	// A manual-capture charge whose authorization's reply was lost is
	// resolved authorized, never captured.
	authBody := []byte(`{"order_id": 10, "amount_cents": 800, "payment_token": "tok_fail_after", "capture_method": "manual"}`)
	c, err = apitest.Do(t, nil, "POST", r.base+"/v1/charges", authBody, map[string]string{"Idempotency-Key": "lost-auth"})
	if err != nil || c.Status != 202 {
		t.Fatalf("manual tok_fail_after: %d %s (%v)", c.Status, c.Body, err)
	}
	_ = json.Unmarshal(c.Body, &ch)
	if _, stderr, err := resolve("--status", "captured", "--reason", "support ticket 10"); err == nil || !strings.Contains(stderr, "400") || !strings.Contains(stderr, "capture_method manual") {
		t.Fatalf("resolving a manual charge captured: %v\n%s", err, stderr)
	}
	out, stderr, err = resolve("--status", "authorized", "--reason", "support ticket 10: the authorization holds")
	if err != nil || !strings.Contains(out, `"status": "authorized"`) || !strings.Contains(out, "found: authorized") {
		t.Fatalf("resolve authorized: %v\n%s\n%s", err, out, stderr)
	}
	c, err = apitest.Do(t, nil, "POST", r.base+"/v1/charges", authBody, map[string]string{"Idempotency-Key": "lost-auth"})
	if err != nil || c.Status != 201 || c.Header.Get("Idempotent-Replayed") != "true" || !strings.Contains(string(c.Body), `"status":"authorized","decline_code":null`) ||
		!strings.Contains(string(c.Body), `"capture_method":"manual","amount_captured_cents":0`) {
		t.Fatalf("retry after the authorized resolution: %d %s (%v)", c.Status, c.Body, err)
	}
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	logs := r.stderr.String()
	for _, want := range []string{`msg="admin call" admin=operator method=POST route="POST /admin/v1/charges/{id}/resolve" status=409`, `msg="charge resolved by an operator" admin=operator`} {
		if !strings.Contains(logs, want) {
			t.Errorf("log lacks %s:\n%s", want, logs)
		}
	}
	if strings.Contains(logs, "ak_test_demo\n") || strings.Contains(logs, "lost-reply") {
		t.Error("the log shows the admin key or the idempotency key")
	}
}

// lossyAcquirer serves a simulator over HTTP, as a remote acquirer, and
// while lose is set answers captures and voids of authorizations, and
// refunds, 503 after the simulator settled them: the reply is lost.
func lossyAcquirer(t *testing.T) (url string, lose *atomic.Bool) {
	t.Helper()
	lose = &atomic.Bool{}
	h := acquirer.Handler(apitest.Simulator(t, acquirer.Options{}))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		settles := r.Method == http.MethodPost && (r.URL.Path == "/v1/authorizations/capture" || r.URL.Path == "/v1/authorizations/void" || r.URL.Path == "/v1/refunds")
		if !settles || !lose.Load() {
			h.ServeHTTP(w, r)
			return
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		http.Error(w, `{"type":"unavailable"}`, http.StatusServiceUnavailable)
	}))
	t.Cleanup(srv.Close)
	return srv.URL, lose
}

// TestResolveCommandRefundsAndOperations: `chargeonce resolve` takes a
// refund's id (re_…) and a capture's (cp_…) as well as a charge's, and
// calls its kind's admin route: a refund and a manual capture whose
// answers were lost are resolved from the command line (a decision the
// acquirer contradicts refused), and the merchant's retries replay the
// resolutions. A flag of another kind is a usage error, before any call.
func TestResolveCommandRefundsAndOperations(t *testing.T) {
	t.Parallel()
	acqURL, lose := lossyAcquirer(t)
	r := startServe(t, "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--reconcile-every", "1h", "--acquirer", acqURL)
	m := regexp.MustCompile(`msg="admin listening" addr=(\S+)`).FindStringSubmatch(r.stderr.String())
	if m == nil {
		t.Fatalf("serve logged no admin address:\n%s", r.stderr.String())
	}
	adminURL := "http://" + m[1]
	keyFile := filepath.Join(t.TempDir(), "admin-key")
	if err := os.WriteFile(keyFile, []byte("ak_test_demo\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	resolve := func(id string, args ...string) (string, string, error) {
		var out, errb bytes.Buffer
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		err := Main(ctx, append([]string{"resolve", id, "--admin-url", adminURL, "--admin-key-file", keyFile}, args...), &out, &errb)
		return out.String(), errb.String(), err
	}
	post := func(path, key, body string, want int) []byte {
		t.Helper()
		c, err := apitest.Do(t, nil, "POST", r.base+path, []byte(body), map[string]string{"Idempotency-Key": key})
		if err != nil || c.Status != want {
			t.Fatalf("POST %s: %d %s (%v), want %d", path, c.Status, c.Body, err, want)
		}
		return c.Body
	}
	var ch, auth, rf struct{ ID string }
	_ = json.Unmarshal(post("/v1/charges", "captured", `{"order_id": 11, "amount_cents": 900, "payment_token": "tok_ok"}`, 201), &ch)
	_ = json.Unmarshal(post("/v1/charges", "authorized", `{"order_id": 12, "amount_cents": 800, "payment_token": "tok_ok", "capture_method": "manual"}`, 201), &auth)
	lose.Store(true)
	_ = json.Unmarshal(post("/v1/charges/"+ch.ID+"/refunds", "refund-lost", `{"amount_cents": 400}`, 202), &rf)
	post("/v1/charges/"+auth.ID+"/capture", "capture-lost", `{"amount_cents": 500}`, 202)
	lose.Store(false)

	// The capture's id, from the stuck list.
	req, _ := http.NewRequestWithContext(t.Context(), "GET", adminURL+"/admin/v1/charges", nil)
	req.Header.Set("Authorization", "Bearer ak_test_demo")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var list struct {
		Data []struct {
			Kind      string
			Operation *struct{ ID string }
		}
	}
	err = json.NewDecoder(resp.Body).Decode(&list)
	resp.Body.Close()
	var capID string
	for _, row := range list.Data {
		if row.Kind == "capture" && row.Operation != nil {
			capID = row.Operation.ID
		}
	}
	if err != nil || capID == "" || !strings.HasPrefix(rf.ID, "re_") {
		t.Fatalf("no stuck capture listed (%v), or no refund id %q: %+v", err, rf.ID, list)
	}

	for _, tc := range []struct {
		id   string
		args []string
		want string
	}{
		{rf.ID, []string{"--status", "failed", "--decline-code", "x", "--reason", "r"}, "--decline-code is for a charge"},
		{capID, []string{"--status", "failed", "--decline-code", "x", "--reason", "r"}, "a capture (" + capID + ") takes --failure-reason"},
		{ch.ID, []string{"--status", "declined", "--failure-reason", "x", "--reason", "r"}, "takes --decline-code"},
	} {
		if _, _, err := resolve(tc.id, tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("resolve %s %v: %v, want a usage error saying %q", tc.id, tc.args, err, tc.want)
		}
	}
	if _, stderr, err := resolve(rf.ID, "--status", "failed", "--reason", "the bank says it bounced"); err == nil || !strings.Contains(stderr, "Acquirer disagrees") || !strings.Contains(stderr, "found: succeeded") {
		t.Fatalf("failing a refund the acquirer made: %v\n%s", err, stderr)
	}
	out, stderr, err := resolve(rf.ID, "--status", "succeeded", "--reason", "support ticket 21")
	if err != nil || !strings.Contains(out, `"status": "succeeded"`) || !strings.Contains(out, `"refund"`) || !strings.Contains(out, `"actor": "admin:operator"`) {
		t.Fatalf("resolve the refund: %v\n%s\n%s", err, out, stderr)
	}
	if _, stderr, err := resolve(capID, "--status", "failed", "--reason", "the bank says no"); err == nil || !strings.Contains(stderr, "Acquirer disagrees") {
		t.Fatalf("failing a capture the acquirer made: %v\n%s", err, stderr)
	}
	out, stderr, err = resolve(capID, "--status", "succeeded", "--reason", "support ticket 22")
	if err != nil || !strings.Contains(out, `"kind": "capture"`) || !strings.Contains(out, `"status": "captured"`) {
		t.Fatalf("resolve the capture: %v\n%s\n%s", err, out, stderr)
	}
	if _, stderr, err := resolve(capID, "--status", "succeeded", "--reason", "again"); err == nil || !strings.Contains(stderr, "Charge not processing") {
		t.Fatalf("resolving the capture again: %v %s", err, stderr)
	}
	if b := post("/v1/charges/"+ch.ID+"/refunds", "refund-lost", `{"amount_cents": 400}`, 201); !strings.Contains(string(b), `"status":"succeeded"`) {
		t.Fatalf("the refund's retry: %s", b)
	}
	if b := post("/v1/charges/"+auth.ID+"/capture", "capture-lost", `{"amount_cents": 500}`, 200); !strings.Contains(string(b), `"status":"captured"`) {
		t.Fatalf("the capture's retry: %s", b)
	}
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	logs := r.stderr.String()
	for _, want := range []string{`route="POST /admin/v1/refunds/{id}/resolve" status=200`, `route="POST /admin/v1/operations/{id}/resolve" status=200`} {
		if !strings.Contains(logs, want) {
			t.Errorf("log lacks %s", want)
		}
	}
}
