package queue_test

import (
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/idempotency"
	"github.com/chargeonce/chargeonce/internal/apitest"
	"github.com/chargeonce/chargeonce/queue"
)

// TestWorkerLogsNoRawKeys (issue 17.7): the worker's warnings and errors
// name an intent by key_hash, as serve's request lines do, never by its raw
// Idempotency-Key (a bearer secret of a sort: it replays the stored answer).
func TestWorkerLogsNoRawKeys(t *testing.T) {
	t.Parallel()
	e := setup(t)
	var logged apitest.Buffer
	eng := engine.New(failingStore{Store: e.store}, e.acq.client(), e.opts)
	w := queue.NewWorker(e.js, eng, e.store, queue.WorkerOptions{MaxDeliver: 2, Logger: slog.New(slog.NewJSONHandler(&logged, nil))})
	if err := w.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	const key = "idem-worker-canary-5d2a"
	e.send(key, body(90, "tok_ok"), "")
	apitest.Eventually(t, 20*time.Second, "the dead letter", func() bool {
		return len(messages(t, e.js, queue.DeadSubject(merchant))) == 1
	})
	w.Stop()
	out := logged.String()
	if strings.Contains(out, "canary") {
		t.Fatalf("the worker logged the raw Idempotency-Key:\n%s", out)
	}
	hashed := 0
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var l map[string]any
		if err := json.Unmarshal([]byte(line), &l); err != nil {
			t.Fatalf("not JSON: %q", line)
		}
		if l["key_hash"] == idempotency.KeyHash(merchant, key) {
			hashed++
		}
	}
	if hashed < 2 {
		t.Fatalf("%d lines name the intent by key_hash, want the warning and the give-up:\n%s", hashed, out)
	}
}
