package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce/httpapi"
	"github.com/chargeonce/chargeonce/internal/apitest"
)

// TestServeLogsJSONRequestLines runs serve with --log-format json and real
// API keys, charges once, and checks that every line on stderr is JSON, that
// the charge has its request line (route, merchant, hashed key, outcome),
// and that neither the API key nor the idempotency key was logged.
func TestServeLogsJSONRequestLines(t *testing.T) {
	t.Parallel()
	const secret, idemKey = "sk_live_logformat_canary_7c1e", "idem-logformat-canary-7c1e"
	addr := freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stderr apitest.Buffer
	done := make(chan error, 1)
	go func() {
		done <- Main(ctx, []string{"serve", "--db", "sqlite:" + filepath.Join(t.TempDir(), "c.db"), "--addr", addr,
			"--log-format", "json", "--api-keys", "acme:" + secret}, &apitest.Buffer{}, &stderr)
	}()
	base := "http://" + addr
	apitest.Eventually(t, 10*time.Second, "serve to answer /healthz", func() bool {
		r, err := apitest.Do(t, nil, "GET", base+"/healthz", nil, nil)
		return err == nil && r.Status == 200
	})
	r, err := apitest.Do(t, nil, "POST", base+"/v1/charges", []byte(`{"order_id": 7, "amount_cents": 100, "payment_token": "tok_ok"}`),
		map[string]string{"Authorization": "Bearer " + secret, "Idempotency-Key": idemKey})
	if err != nil || r.Status != 201 {
		t.Fatalf("charge: %v %d %s", err, r.Status, r.Body)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve returned %v\n%s", err, stderr.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatal("serve did not stop")
	}
	logged := stderr.String()
	if strings.Contains(logged, "canary") {
		t.Fatalf("the log holds the API key or the idempotency key:\n%s", logged)
	}
	found := false
	for _, line := range strings.Split(strings.TrimSpace(logged), "\n") {
		var l map[string]any
		if err := json.Unmarshal([]byte(line), &l); err != nil {
			t.Fatalf("--log-format json wrote a line that is not JSON: %q", line)
		}
		if l["msg"] == "request" && l["route"] == "POST /v1/charges" {
			found = true
			if l["outcome"] != "created" || l["merchant"] != "acme" || l["key_hash"] != httpapi.KeyHash("acme", idemKey) || l["status"] != float64(201) {
				t.Errorf("request line %v", l)
			}
		}
	}
	if !found {
		t.Fatalf("no request line for the charge:\n%s", logged)
	}
}

func TestLogFormatFlag(t *testing.T) {
	t.Parallel()
	db := "sqlite:" + filepath.Join(t.TempDir(), "c.db")
	for _, args := range [][]string{
		{"serve", "--db", db, "--log-format", "xml"},
		{"acquirer", "--log-format", "xml"},
		{"reconcile", "--db", db, "--acquirer", "http://127.0.0.1:1", "--log-format", "xml"},
	} {
		err := Main(context.Background(), args, &apitest.Buffer{}, &apitest.Buffer{})
		if err == nil || !strings.Contains(err.Error(), "--log-format") {
			t.Errorf("%v: err = %v, want one naming --log-format", args, err)
		}
	}
	for _, format := range []string{"text", "json"} {
		var b apitest.Buffer
		log, err := newLogger(&b, "info", format)
		if err != nil {
			t.Fatalf("newLogger(%q): %v", format, err)
		}
		log.Info("hello", "n", 1)
		isJSON := json.Valid([]byte(strings.TrimSpace(b.String())))
		if isJSON != (format == "json") {
			t.Errorf("--log-format %s wrote %q", format, b.String())
		}
	}
}

// A JSON log line writes a duration as Go spells it ("30s"), as the flags
// take it, not as nanoseconds: 30000000000 is unreadable in a log pipeline.
func TestJSONLogDurationsAreStrings(t *testing.T) {
	t.Parallel()
	var b apitest.Buffer
	log, err := newLogger(&b, "info", "json")
	if err != nil {
		t.Fatal(err)
	}
	log.Info("hello", "lease", 30*time.Second, "group", slogGroupOfDurations())
	var l map[string]any
	if err := json.Unmarshal([]byte(strings.TrimSpace(b.String())), &l); err != nil {
		t.Fatalf("%q: %v", b.String(), err)
	}
	if l["lease"] != "30s" {
		t.Errorf("lease logged as %#v, want \"30s\" (%s)", l["lease"], b.String())
	}
	if g, _ := l["group"].(map[string]any); g == nil || g["wait"] != "1.5ms" {
		t.Errorf("a duration in a group logged as %#v, want \"1.5ms\" (%s)", l["group"], b.String())
	}
}

func slogGroupOfDurations() slog.Value {
	return slog.GroupValue(slog.Duration("wait", 1500*time.Microsecond))
}
