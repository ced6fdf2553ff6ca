package queue_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/internal/apitest"
	"github.com/chargeonce/chargeonce/queue"
)

// TestPoisonMerchantInSubject (issue 18.8): a subject whose merchant token
// no merchant can have (not UTF-8, not visible ASCII, a colon, too long) is
// poison, not a database outage: its 400 result and its dead-letter copy
// come at the first delivery, and nothing is charged.
func TestPoisonMerchantInSubject(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.worker(queue.WorkerOptions{})
	bad := []string{"\xff\xfebad", "caf\u00e9", "a:b", strings.Repeat("m", 256)}
	for i, m := range bad {
		msg := nats.NewMsg(queue.RequestSubject(m))
		msg.Header.Set(queue.HeaderIdempotencyKey, fmt.Sprintf("k-%d", i))
		msg.Data = []byte(body(int64(70+i), "tok_ok"))
		if _, err := e.js.PublishMsg(t.Context(), msg); err != nil {
			t.Fatalf("publishing for merchant %q: %v", m, err)
		}
	}
	start := time.Now()
	var results, dead []stored
	apitest.Eventually(t, 15*time.Second, "a 400 result and a dead letter for every bad merchant", func() bool {
		results = messages(t, e.js, queue.ResultSubjectPrefix+"*")
		dead = messages(t, e.js, queue.DeadSubjectPrefix+"*")
		return len(results) >= len(bad) && len(dead) >= len(bad)
	})
	t.Logf("answered in %s", time.Since(start).Round(time.Millisecond))
	bySubject := map[string]stored{}
	for _, r := range append(results, dead...) {
		bySubject[r.subject] = r
	}
	for _, m := range bad {
		r, d := bySubject[queue.ResultSubject(m)], bySubject[queue.DeadSubject(m)]
		if r.status() != "400" || !strings.Contains(string(r.body), chargeonce.EINVALID) {
			t.Fatalf("merchant %q: result %s %s; want 400 validation-failed on its result subject", m, r.status(), r.body)
		}
		if d.header.Get(queue.HeaderDeadReason) != chargeonce.EINVALID {
			t.Fatalf("merchant %q: dead letter reason %q", m, d.header.Get(queue.HeaderDeadReason))
		}
	}
	consumerDrained(t, e.js, queue.DefaultDurable, 10*time.Second)
	if st := e.acq.sim.Stats(); st.CaptureRequests != 0 {
		t.Fatalf("the acquirer saw %d requests", st.CaptureRequests)
	}
}
