package main

import (
	"context"
	"errors"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce/internal/apitest"
	"github.com/chargeonce/chargeonce/internal/natstest"
	"github.com/chargeonce/chargeonce/queue"
)

// TestPublishCaptureAndCancel: `publish --capture-method manual`
// authorizes; `--capture-of` captures part of it (200, exit 0), again with
// the same key replays; a capture past an authorization and a cancel of a
// captured charge are refused (400, exit 1); `--cancel-of` voids another
// authorization. Each is sent with its Chargeonce-*-Of header.
func TestPublishCaptureAndCancel(t *testing.T) {
	t.Parallel()
	ns := natstest.Start(t)
	db := "sqlite:" + filepath.Join(t.TempDir(), "p.db")
	ctx, cancel := context.WithCancel(context.Background())
	var werr apitest.Buffer
	done := make(chan error, 1)
	go func() {
		done <- Main(ctx, []string{"worker", "--nats", ns.URL, "--db", db, "--metrics-addr", "127.0.0.1:0"}, &apitest.Buffer{}, &werr)
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("worker: %v", err)
		}
	})
	apitest.Eventually(t, 30*time.Second, "the worker to start", func() bool {
		return strings.Contains(werr.String(), "chargeonce worker consuming")
	})
	run := func(args ...string) (string, int) {
		t.Helper()
		var out, errb apitest.Buffer
		err := Main(context.Background(), append([]string{"publish", "--nats", ns.URL, "--timeout", "20s"}, args...), &out, &errb)
		code := 0
		if ec := exitCodeError(0); errors.As(err, &ec) {
			code = int(ec)
		} else if err != nil {
			t.Fatalf("publish %v: %v\n%s", args, err, errb.String())
		}
		return out.String(), code
	}
	chargeID := regexp.MustCompile(`"id":"(ch_[^"]+)"`)
	authorize := func(order string) string {
		t.Helper()
		out, code := run("--order", order, "--amount", "25000", "--capture-method", "manual", "--key", "auth-"+order)
		m := chargeID.FindStringSubmatch(out)
		if code != 0 || m == nil || !strings.Contains(out, `"status":"authorized"`) {
			t.Fatalf("authorizing order %s: exit %d\n%s", order, code, out)
		}
		return m[1]
	}
	first, second := authorize("201"), authorize("202")

	out, code := run("--capture-of", first, "--amount", "20000", "--key", "capture-1")
	if code != 0 || !strings.HasPrefix(out, "Status: 200\nIdempotency-Key: capture-1\n\n{\"id\":\""+first) || !strings.Contains(out, `"status":"captured"`) || !strings.Contains(out, `"amount_captured_cents":20000`) {
		t.Fatalf("publish --capture-of: exit %d\n%s", code, out)
	}
	again, code := run("--capture-of", first, "--amount", "20000", "--key", "capture-1")
	if code != 0 || !strings.Contains(again, "Idempotent-Replayed: true") || !strings.HasSuffix(again, out[strings.Index(out, "\n\n"):]) {
		t.Fatalf("publish --capture-of again: exit %d\n%s\nwant the first body", code, again)
	}
	out, code = run("--capture-of", second, "--amount", "30000", "--key", "capture-2")
	if code != 1 || !strings.HasPrefix(out, "Status: 400") || !strings.Contains(out, "capture-exceeds-authorized") {
		t.Fatalf("a capture past the authorization: exit %d\n%s", code, out)
	}
	out, code = run("--cancel-of", first, "--key", "cancel-1")
	if code != 1 || !strings.HasPrefix(out, "Status: 400") || !strings.Contains(out, "charge-not-authorized") {
		t.Fatalf("a cancel of a captured charge: exit %d\n%s", code, out)
	}
	out, code = run("--cancel-of", second, "--key", "cancel-2")
	if code != 0 || !strings.HasPrefix(out, "Status: 200\nIdempotency-Key: cancel-2\n\n{\"id\":\""+second) || !strings.Contains(out, `"status":"canceled"`) {
		t.Fatalf("publish --cancel-of: exit %d\n%s", code, out)
	}

	// Each operation went out with its header naming the charge.
	js := natstest.JetStream(t, ns.URL)
	headers := map[string]int{}
	for _, m := range natstest.ReadAll(t, js, queue.RequestStream, queue.RequestSubject("demo")) {
		for _, h := range []string{queue.HeaderCaptureOf, queue.HeaderCancelOf, queue.HeaderRefundOf} {
			if v := m.Header.Values(h); len(v) > 0 {
				headers[h]++
				if len(v) != 1 || (v[0] != first && v[0] != second) {
					t.Errorf("%s: %v; want one charge id", h, v)
				}
			}
		}
	}
	if headers[queue.HeaderCaptureOf] != 3 || headers[queue.HeaderCancelOf] != 2 || headers[queue.HeaderRefundOf] != 0 {
		t.Errorf("operation headers sent: %v; want 3 captures and 2 cancels", headers)
	}
}

// TestPublishOperationFlags: flags that make no operation are refused
// before anything is sent, naming the flag.
func TestPublishOperationFlags(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--capture-of", "ch_1", "--cancel-of", "ch_1"}, "--capture-of and --cancel-of"},
		{[]string{"--refund-of", "ch_1", "--capture-of", "ch_1"}, "--refund-of and --capture-of"},
		{[]string{"--capture-of", "ch_1", "--amount", "-1"}, "--amount"},
		{[]string{"--cancel-of", "ch_1", "--amount", "5"}, "--amount"},
		{[]string{"--capture-of", "ch_1", "--reason", "duplicate"}, "--reason"},
		{[]string{"--cancel-of", "ch_1", "--capture-method", "manual"}, "--capture-method"},
		{[]string{"--capture-of", "ch_1", "--timeout", "0s"}, "--timeout"},
	} {
		var out, errb apitest.Buffer
		err := Main(context.Background(), append([]string{"publish", "--nats", "nats://127.0.0.1:1"}, tc.args...), &out, &errb)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: err = %v, want it to name %s", tc.args, err, tc.want)
		}
	}
}
