package httpapi_test

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/internal/apitest"
)

// lockedBuffer is a log destination the server's goroutines share.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// At --log-level debug the engine says what it decided for each attempt,
// with the key's hash and never the key: a new key sent to the acquirer, a
// replay, a key reused for another request.
func TestDebugLogsEachAttemptsDecision(t *testing.T) {
	t.Parallel()
	var logs lockedBuffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	f := setup(t, "sqlite", engine.Options{Logger: log}, acquirer.Options{})
	const key = "debug-canary-key-7f3a"
	order := orderSeq.Add(1)
	for _, body := range []string{chargeBody(order, "tok_ok"), chargeBody(order, "tok_ok"), chargeBody(order+1, "tok_ok")} {
		apitest.Charge(t, f.inst.URL, key, body)
	}
	out := logs.String()
	for _, want := range []string{"new key: inserted, admitted, sending to the acquirer", "key completed: replaying the stored answer", "key used for a different request: 422", "key_hash="} {
		if !strings.Contains(out, want) {
			t.Errorf("debug log lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, key) {
		t.Errorf("debug log holds the raw Idempotency-Key:\n%s", out)
	}
}
