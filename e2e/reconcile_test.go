package e2e

import (
	"fmt"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/idempotency"
	"github.com/chargeonce/chargeonce/internal/apitest"
	"github.com/chargeonce/chargeonce/internal/pgtest"
)

// insertOrphans inserts n records as attempts leave them when they die after
// committing: processing, lease over, the acquirer maybe never called.
func insertOrphans(t *testing.T, url string, n int, token string) (orders []int64) {
	t.Helper()
	store := apitest.PostgresStoreAt(t, url)
	for i := range n {
		req := &chargeonce.ChargeRequest{OrderID: newOrder(), AmountCents: 1000 + int64(i), PaymentToken: token}
		if err := req.Normalize(); err != nil {
			t.Fatal(err)
		}
		_, inserted, err := store.KeyInsert(t.Context(), chargeonce.KeyInsertParams{
			Fingerprint: idempotency.Fingerprint("POST", "/v1/charges", req),
			Token:       idempotency.NewToken(),
			Lease:       0,
			Charge: chargeonce.Charge{
				ID: idempotency.NewChargeID(), MerchantID: "demo", IdempotencyKey: fmt.Sprintf("orphan-%04d", i),
				OrderID: req.OrderID, AmountCents: req.AmountCents, Currency: req.Currency, PaymentToken: req.PaymentToken,
			},
		})
		if err != nil || !inserted {
			t.Fatalf("inserting orphan %d: inserted=%v, %v", i, inserted, err)
		}
		orders = append(orders, req.OrderID)
	}
	return orders
}

var reconcileLine = regexp.MustCompile(`claimed=(\d+) settled=(\d+) deferred=(\d+) stuck=(\d+) oldest_stuck_age=(\S+)`)

// reconcileResult parses the line `chargeonce reconcile` prints.
func reconcileResult(t *testing.T, p *proc) (claimed, settled, deferred, stuck int, oldest string) {
	t.Helper()
	m := reconcileLine.FindStringSubmatch(p.logText())
	if m == nil {
		t.Fatalf("%s printed no result line:\n%s", p.name, p.logText())
	}
	n := func(s string) int { v, _ := strconv.Atoi(s); return v }
	return n(m[1]), n(m[2]), n(m[3]), n(m[4]), m[5]
}

// TestReconcilePassesRace: two `chargeonce reconcile` processes started
// together on 200 orphans split them: every orphan is claimed by exactly
// one pass (the claims add up to 200 and the acquirer gets exactly one
// request per reference), and each ends captured once.
func TestReconcilePassesRace(t *testing.T) {
	t.Parallel()
	const orphans = 200
	url := pgtest.URL(t)
	orders := insertOrphans(t, url, orphans, "tok_ok")
	ps := newProcs(t)
	// Latency keeps each pass busy long enough (200 captures, 8 at a
	// time) for the two to overlap even on a loaded machine.
	acq := ps.startAcquirer("acquirer", "--latency", "80ms")
	args := []string{"reconcile", "--db", withParams(url, "pool_max_conns", "4"), "--acquirer", acq.URL(),
		"--lease", "30s", "--acquirer-timeout", "10s"}
	start := time.Now()
	p1 := ps.start("reconcile-1", args...)
	p2 := ps.start("reconcile-2", args...)
	for _, p := range []*proc{p1, p2} {
		if !p.wait(90 * time.Second) {
			t.Fatalf("%s did not finish within 90s", p.name)
		}
		if err := p.exitErr(); err != nil {
			t.Fatalf("%v:\n%s", err, p.logText())
		}
	}
	took := time.Since(start)
	c1, s1, d1, k1, _ := reconcileResult(t, p1)
	c2, s2, d2, k2, _ := reconcileResult(t, p2)
	t.Logf("reconcile-1 claimed %d, reconcile-2 claimed %d, in %v", c1, c2, took.Round(time.Millisecond))
	if c1 == 0 || c2 == 0 {
		t.Errorf("one pass claimed nothing (%d, %d): the passes did not race", c1, c2)
	}
	if c1+c2 != orphans || s1+s2 != orphans || d1+d2 != 0 {
		t.Errorf("claimed %d+%d, settled %d+%d, deferred %d+%d; want every one of %d orphans claimed and settled once",
			c1, c2, s1, s2, d1, d2, orphans)
	}
	if k1 != 0 && k2 != 0 {
		t.Errorf("stuck after both passes: %d, %d; want 0 from the pass that ended last", k1, k2)
	}
	st, err := acquirerClient(acq).Stats(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if st.CaptureRequests != orphans || st.Captures != orphans || st.DuplicateRequests != 0 {
		t.Errorf("acquirer stats %+v; want exactly one request and one capture per orphan", st)
	}
	if n := queryInt(t, url, `SELECT count(*) FROM idempotency_keys WHERE state = 'completed' AND response_status = 201`); n != orphans {
		t.Errorf("%d records completed with 201, want %d", n, orphans)
	}
	if n := queryInt(t, url, `SELECT count(*) FROM charges WHERE status = 'captured' AND order_id = ANY($1)`, orders); n != orphans {
		t.Errorf("%d charges captured, want %d", n, orphans)
	}
}

// TestReconcileReportsOrphans: with the acquirer unreachable, `chargeonce
// reconcile` claims the orphans, cannot settle them, backs them off, and its
// result line still counts them as stuck, with the age of the oldest.
func TestReconcileReportsOrphans(t *testing.T) {
	t.Parallel()
	const orphans = 5
	url := pgtest.URL(t)
	insertOrphans(t, url, orphans, "tok_ok")
	ps := newProcs(t)
	acq := ps.startAcquirer("acquirer")
	acq.kill() // nothing listens on its address any more
	time.Sleep(300 * time.Millisecond)
	p := ps.start("reconcile", "reconcile", "--db", url, "--acquirer", acq.URL(), "--lease", "5s", "--acquirer-timeout", "1s")
	if !p.wait(60 * time.Second) {
		t.Fatalf("reconcile did not finish within 60s")
	}
	if err := p.exitErr(); err != nil {
		t.Fatalf("%v:\n%s", err, p.logText())
	}
	claimed, settled, deferred, stuck, oldest := reconcileResult(t, p)
	if claimed != orphans || settled != 0 || deferred != orphans || stuck != orphans {
		t.Fatalf("reconcile: claimed=%d settled=%d deferred=%d stuck=%d; want all %d claimed, deferred and reported stuck",
			claimed, settled, deferred, stuck, orphans)
	}
	if d, err := time.ParseDuration(oldest); err != nil || d < 300*time.Millisecond {
		t.Fatalf("oldest_stuck_age=%s; want the oldest orphan's age", oldest)
	}
	if n := queryInt(t, url, `SELECT count(*) FROM idempotency_keys WHERE state = 'processing' AND recovery_attempts = 1`); n != orphans {
		t.Fatalf("%d records processing with one recovery attempt, want %d", n, orphans)
	}
}
