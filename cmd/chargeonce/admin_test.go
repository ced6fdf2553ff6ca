package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

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
// name, and the merchant's retry replays it.
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
