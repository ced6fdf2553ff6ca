package recovery_test

import (
	"bufio"
	"context"
	"errors"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/metrics"
	"github.com/chargeonce/chargeonce/recovery"
)

// unreachableStore fails recovery's reads while down, as a store does while
// its database cannot be reached.
type unreachableStore struct {
	chargeonce.Store
	down atomic.Bool
}

var errUnreachable = errors.New("failed to connect to `host=127.0.0.1 user=postgres database=test`: dial error (dial tcp 127.0.0.1:5432: connect: connection refused)")

func (s *unreachableStore) KeysClaimExpired(ctx context.Context, lease time.Duration, limit int) ([]chargeonce.KeyRecord, error) {
	if s.down.Load() {
		return nil, errUnreachable
	}
	return s.Store.KeysClaimExpired(ctx, lease, limit)
}

func (s *unreachableStore) KeysStuck(ctx context.Context) (chargeonce.StuckStats, error) {
	if s.down.Load() {
		return chargeonce.StuckStats{}, errUnreachable
	}
	return s.Store.KeysStuck(ctx)
}

// scrape reads one unlabelled sample from the metrics handler.
func scrape(t *testing.T, m *metrics.Metrics, name string) float64 {
	t.Helper()
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	sc := bufio.NewScanner(rec.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			return f
		}
	}
	t.Fatalf("/metrics has no %s", name)
	return 0
}

// TestStuckGaugeMovesWhileDatabaseIsDown: while recovery passes fail (the
// database is unreachable) the oldest-stuck-age gauge keeps growing from its
// last measured value instead of freezing, and failed passes are counted:
// an outage of the database must not look like a quiet night.
func TestStuckGaugeMovesWhileDatabaseIsDown(t *testing.T) {
	t.Parallel()
	var us *unreachableStore
	e := setup(t, func(s chargeonce.Store) chargeonce.Store { us = &unreachableStore{Store: s}; return us }, engine.Options{})
	e.acq.down.Store(true)
	orphan(t, e.store, "stuck", request("tok_ok"))
	m := metrics.New()
	r := recovery.NewRescuer(e.store, e.eng, recovery.RescuerOptions{OnPass: m.RecoveryPass, OnFailure: m.RecoveryPassFailed})

	if _, err := r.RunOnce(t.Context()); err != nil {
		t.Fatalf("RunOnce: %v", err)
	}
	measured := scrape(t, m, "chargeonce_stuck_oldest_age_seconds")
	if n := scrape(t, m, "chargeonce_stuck_records"); n != 1 || measured <= 0 {
		t.Fatalf("after a pass: stuck %v, oldest age %v; want 1 and its age", n, measured)
	}

	us.down.Store(true)
	const outage = 300 * time.Millisecond
	time.Sleep(outage)
	if _, err := r.RunOnce(t.Context()); err == nil {
		t.Fatalf("RunOnce succeeded with the database down")
	}
	age := scrape(t, m, "chargeonce_stuck_oldest_age_seconds")
	t.Logf("oldest age: %.3fs measured, %.3fs after %v of failed passes", measured, age, outage)
	if age < measured+outage.Seconds() {
		t.Errorf("oldest age %.3fs while passes fail; want it to keep growing from %.3fs (at least %.3fs)", age, measured, measured+outage.Seconds())
	}
	if n := scrape(t, m, "chargeonce_recovery_pass_failures_total"); n != 1 {
		t.Errorf("chargeonce_recovery_pass_failures_total = %v, want 1", n)
	}

	// The database is back: the gauge is measured again.
	us.down.Store(false)
	if _, err := r.RunOnce(t.Context()); err != nil {
		t.Fatalf("RunOnce: %v", err)
	}
	if again := scrape(t, m, "chargeonce_stuck_oldest_age_seconds"); again < measured+outage.Seconds() || again > age+10 {
		t.Errorf("oldest age %.3fs once measured again; want the record's real age (over %.3fs)", again, measured+outage.Seconds())
	}
}
