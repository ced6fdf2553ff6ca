package chaos

import (
	"os"
	"strings"
	"testing"
	"time"
)

// TestChaosCatchesSkippedLookup proves that the checker catches a real bug:
// the binary is built with the tag chaos_broken, whose recovery re-sends a
// reference without looking it up first (engine/redrive_lookup_broken.go).
// Under the nemesis's acquirer outages, longer than the acquirer's
// idempotency window, an intent whose reply was lost (tok_fail_after) is
// captured a second time when recovery re-sends it after the outage. The
// run must report anomalies, each naming its intent, with the acquirer's
// ledger holding two captures for at least one captured intent, and write
// porcupine's visualisation of it.
func TestChaosCatchesSkippedLookup(t *testing.T) {
	t.Parallel()
	r := runChaos(t, config{seed: 7, duration: brokenTime, tags: "chaos_broken",
		weights: map[string]int{"acquirer-outage": 40, "pg-restart": 0}})
	if len(r.anomalies) == 0 {
		t.Fatalf("the broken build (no lookup before a re-drive) ran %d intents with %v and the checker found no anomaly", r.intents, r.faults)
	}
	doubles := 0
	for _, a := range r.anomalies {
		s := a.String()
		if !strings.Contains(s, "intent "+a.Intent.Key+" ") {
			t.Errorf("an anomaly does not name its intent: %s", s)
		}
		if a.HTML == "" {
			t.Errorf("no visualisation written for %s", a.Intent.Key)
		} else if b, err := os.ReadFile(a.HTML); err != nil || !strings.Contains(string(b), "<html") {
			t.Errorf("visualisation %s: %v", a.HTML, err)
		}
		for _, op := range a.Ops {
			if op.In.Kind == opLedger && op.Out.Captured >= 2 {
				doubles++
			}
		}
	}
	if doubles == 0 {
		t.Errorf("no anomaly shows a double capture in the ledger:\n%v", r.anomalies)
	}
	t.Logf("the checker caught the broken build: %d anomalies, %d double captures; first:\n%s", len(r.anomalies), doubles, r.anomalies[0])
	// The anomalies were expected: keep the output only when asked.
	if os.Getenv("CHAOS_OUT") == "" {
		t.Cleanup(func() { os.RemoveAll(r.dir) })
	}
}

// brokenTime is how long the broken build runs: a few outages' worth.
const brokenTime = 20 * time.Second
