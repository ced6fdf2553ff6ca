package metrics_test

import (
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/metrics"
	"github.com/chargeonce/chargeonce/recovery"
)

// TestOperatorMetrics: what recovery, the sweeper, admission and the pool
// report shows on /metrics under the names the README lists.
func TestOperatorMetrics(t *testing.T) {
	t.Parallel()
	m := metrics.New()
	m.RecoveryPass(recovery.PassResult{Claimed: 5, Settled: 3, Deferred: 2, Stuck: chargeonce.StuckStats{Count: 2, OldestAge: 90 * time.Second}})
	m.RecoveryPass(recovery.PassResult{Claimed: 1, Settled: 1})
	m.Swept(1000)
	m.Swept(7)
	m.Expired(recovery.ExpiryPass{Canceled: 4, Failed: 2, Skipped: 1})
	m.Expired(recovery.ExpiryPass{Failed: 1, Errors: 3})
	m.Admission(0, true)
	m.Admission(500*time.Millisecond, false)
	m.Pool(func() metrics.PoolStats {
		return metrics.PoolStats{Acquired: 3, Idle: 7, Total: 10, Max: 10, Waits: 42, WaitTime: 1500 * time.Millisecond}
	})

	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	text := string(body)
	for _, want := range []string{
		`chargeonce_recovery_records_total{result="claimed"} 6`,
		`chargeonce_recovery_records_total{result="settled"} 4`,
		`chargeonce_recovery_records_total{result="deferred"} 2`,
		`chargeonce_stuck_records 0`, // the last pass found none
		`chargeonce_keys_swept_total 1007`,
		`chargeonce_authorizations_expired_total{outcome="canceled"} 4`,
		`chargeonce_authorizations_expired_total{outcome="pending"} 0`,
		`chargeonce_authorizations_expired_total{outcome="failed"} 3`,
		`chargeonce_authorizations_expired_total{outcome="skipped"} 1`,
		`chargeonce_authorizations_expired_total{outcome="error"} 3`,
		`chargeonce_admission_wait_seconds_count{result="admitted"} 1`,
		`chargeonce_admission_wait_seconds_count{result="shed"} 1`,
		`chargeonce_admission_wait_seconds_sum{result="shed"} 0.5`,
		`chargeonce_db_pool_acquired_connections 3`,
		`chargeonce_db_pool_idle_connections 7`,
		`chargeonce_db_pool_total_connections 10`,
		`chargeonce_db_pool_max_connections 10`,
		`chargeonce_db_pool_waits_total 42`,
		`chargeonce_db_pool_wait_seconds_total 1.5`,
	} {
		if !strings.Contains(text, want+"\n") {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if t.Failed() {
		t.Logf("/metrics:\n%s", text)
	}
}
