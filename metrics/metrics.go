// Package metrics exposes chargeonce's Prometheus metrics: answers by status
// and replay, acquirer latency and errors, admission waits and shed
// attempts, recovery passes and the orphan gauges operators watch for stuck
// charges, keys swept, and the database pool. The README lists every metric
// with what it means when it moves.
package metrics

import (
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/internal/httpserve"
	"github.com/chargeonce/chargeonce/recovery"
)

// Metrics implements engine.Observer and httpapi.OutcomeObserver, and
// serves the registry.
type Metrics struct {
	reg          *prometheus.Registry
	outcomes     *prometheus.CounterVec
	operations   *prometheus.CounterVec // refunds', captures' and cancels' attempts
	acquirer     *prometheus.HistogramVec
	stuckCount   prometheus.Gauge
	passFailures prometheus.Counter
	recovered    *prometheus.CounterVec // records claimed, settled, deferred by recovery
	swept        prometheus.Counter
	expired      *prometheus.CounterVec // expired authorizations the sweeper tried, by outcome
	admission    *prometheus.HistogramVec
	rateLimited  *prometheus.CounterVec
	rejected     *prometheus.CounterVec
	// counters cached per status so the hot path does no label lookup.
	cache map[[2]int]prometheus.Counter

	// The oldest stuck age as last measured, when, and whether passes have
	// failed since (see stuckOldestAge).
	mu         sync.Mutex
	oldest     time.Duration
	measuredAt time.Time
	failing    bool
	now        func() time.Time
}

// New registers chargeonce's metrics (and the Go runtime's) in a new
// registry.
func New() *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "chargeonce_charge_attempts_total",
			Help: "POST /v1/charges answers to attempts that reached the engine, by HTTP status and whether the answer was a replay.",
		}, []string{"status", "replayed"}),
		operations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "chargeonce_operation_attempts_total",
			Help: "Answers to attempts of refunds, captures and cancels (POST /v1/charges/{id}/refunds, /capture, /cancel) that reached the engine, by kind, HTTP status and whether the answer was a replay; not counted as charge attempts.",
		}, []string{"kind", "status", "replayed"}),
		acquirer: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "chargeonce_acquirer_call_seconds",
			Help:    "Latency of acquirer capture calls, by result (ok or unknown).",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14),
		}, []string{"result"}),
		stuckCount: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "chargeonce_stuck_records",
			Help: "Processing idempotency records whose lease has ended (orphans not yet settled by recovery).",
		}),
		passFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "chargeonce_recovery_pass_failures_total",
			Help: "Recovery passes that failed (typically: the database was unreachable).",
		}),
		recovered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "chargeonce_recovery_records_total",
			Help: "Records recovery claimed, and of those how many it settled (final answer stored) or deferred (outcome still unknown, backed off).",
		}, []string{"result"}),
		swept: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "chargeonce_keys_swept_total",
			Help: "Expired idempotency records deleted by the sweeper (their charges are kept).",
		}),
		expired: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "chargeonce_authorizations_expired_total",
			Help: "Expired authorizations the sweeper tried to cancel, by outcome: canceled, pending (left to recovery), failed (the acquirer refused the void: the charge stays authorized for an operator, never tried again), skipped (settled or held meanwhile), error.",
		}, []string{"outcome"}),
		admission: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "chargeonce_admission_wait_seconds",
			Help:    "How long attempts that must call the acquirer waited for an acquirer slot, by result: admitted, or shed (503 overloaded, or the client gave up while waiting).",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 12),
		}, []string{"result"}),
		rateLimited: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "chargeonce_rate_limited_total",
			Help: "Charge attempts refused with 429 rate-limited, by reason: rate (the merchant is over its --merchant-rate) or share (it held its share of the acquirer slots while other merchants needed them).",
		}, []string{"reason"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "chargeonce_http_rejected_requests_total",
			Help: "Requests refused as the client's mistake or over its rate (400, 401, 405, 413, 429), by route (the pattern that matched, never the path), status and problem slug.",
		}, []string{"route", "status", "problem"}),
		cache: map[[2]int]prometheus.Counter{},
		now:   time.Now,
	}
	stuckOldest := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "chargeonce_stuck_oldest_age_seconds",
		Help: "Age of the oldest processing record whose lease has ended. While recovery passes fail it keeps growing from its last measured value.",
	}, m.stuckOldestAge)
	m.reg.MustRegister(m.outcomes, m.operations, m.acquirer, m.stuckCount, stuckOldest, m.passFailures, m.recovered, m.swept, m.expired, m.admission, m.rateLimited, m.rejected,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	for _, outcome := range expiryOutcomes {
		m.expired.WithLabelValues(outcome) // exported as 0 from the start
	}
	for _, reason := range []string{engine.RateLimitedRate, engine.RateLimitedShare} {
		m.rateLimited.WithLabelValues(reason) // exported as 0 from the start
	}
	for _, st := range []int{201, 202, 402, 409, 422, 500} {
		for _, rp := range []int{0, 1} {
			m.cache[[2]int{st, rp}] = m.outcomes.WithLabelValues(strconv.Itoa(st), strconv.FormatBool(rp == 1))
		}
	}
	return m
}

// Outcome implements httpapi.OutcomeObserver.
func (m *Metrics) Outcome(status int, replayed bool) {
	rp := 0
	if replayed {
		rp = 1
	}
	if c, ok := m.cache[[2]int{status, rp}]; ok {
		c.Inc()
		return
	}
	m.outcomes.WithLabelValues(strconv.Itoa(status), strconv.FormatBool(replayed)).Inc()
}

// OperationOutcome implements httpapi.OperationOutcomeObserver.
func (m *Metrics) OperationOutcome(kind string, status int, replayed bool) {
	m.operations.WithLabelValues(kind, strconv.Itoa(status), strconv.FormatBool(replayed)).Inc()
}

// Rejected implements httpapi.RejectionObserver. A request no route
// matched is counted under route "unmatched".
func (m *Metrics) Rejected(route string, status int, problem string) {
	if route == "" {
		route = "unmatched"
	}
	m.rejected.WithLabelValues(route, strconv.Itoa(status), problem).Inc()
}

// AcquirerCall implements engine.Observer.
func (m *Metrics) AcquirerCall(d time.Duration, err error) {
	result := "ok"
	if err != nil {
		result = "unknown"
	}
	m.acquirer.WithLabelValues(result).Observe(d.Seconds())
}

// Admission implements engine.AdmissionObserver.
func (m *Metrics) Admission(wait time.Duration, admitted bool) {
	result := "admitted"
	if !admitted {
		result = "shed"
	}
	m.admission.WithLabelValues(result).Observe(wait.Seconds())
}

// RateLimited implements engine.RateLimitObserver.
func (m *Metrics) RateLimited(reason string) {
	m.rateLimited.WithLabelValues(reason).Inc()
}

// RecoveryPass records what a successful recovery pass did.
func (m *Metrics) RecoveryPass(p recovery.PassResult) {
	m.recovered.WithLabelValues("claimed").Add(float64(p.Claimed))
	m.recovered.WithLabelValues("settled").Add(float64(p.Settled))
	m.recovered.WithLabelValues("deferred").Add(float64(p.Deferred))
	m.Stuck(p.Stuck)
}

// Swept counts the records a sweep deleted.
func (m *Metrics) Swept(n int) { m.swept.Add(float64(n)) }

// expiryOutcomes are the outcome labels of chargeonce_authorizations_expired_total.
var expiryOutcomes = []string{"canceled", "pending", "failed", "skipped", "error"}

// Expired counts what a sweep's pass over the expired authorizations did.
func (m *Metrics) Expired(p recovery.ExpiryPass) {
	for i, n := range []int{p.Canceled, p.Pending, p.Failed, p.Skipped, p.Errors} {
		m.expired.WithLabelValues(expiryOutcomes[i]).Add(float64(n))
	}
}

// PoolStats describe a store's connection pool at one moment.
type PoolStats struct {
	Acquired, Idle, Total, Max int
	// Waits counts acquisitions that found no idle connection and waited;
	// WaitTime is their total wait.
	Waits    int64
	WaitTime time.Duration
}

// Pool exports the connection pool that stats reads, read at every scrape.
func (m *Metrics) Pool(stats func() PoolStats) {
	gauge := func(name, help string, v func(PoolStats) float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, func() float64 { return v(stats()) })
	}
	counter := func(name, help string, v func(PoolStats) float64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, func() float64 { return v(stats()) })
	}
	m.reg.MustRegister(
		gauge("chargeonce_db_pool_acquired_connections", "Database connections in use.", func(s PoolStats) float64 { return float64(s.Acquired) }),
		gauge("chargeonce_db_pool_idle_connections", "Idle database connections.", func(s PoolStats) float64 { return float64(s.Idle) }),
		gauge("chargeonce_db_pool_total_connections", "Open database connections.", func(s PoolStats) float64 { return float64(s.Total) }),
		gauge("chargeonce_db_pool_max_connections", "The most database connections the pool opens.", func(s PoolStats) float64 { return float64(s.Max) }),
		counter("chargeonce_db_pool_waits_total", "Connection acquisitions that had to wait for a connection.", func(s PoolStats) float64 { return float64(s.Waits) }),
		counter("chargeonce_db_pool_wait_seconds_total", "Total time spent waiting for a database connection.", func(s PoolStats) float64 { return s.WaitTime.Seconds() }),
	)
}

// Stuck records the orphan statistics of a recovery pass.
func (m *Metrics) Stuck(s chargeonce.StuckStats) {
	m.stuckCount.Set(float64(s.Count))
	m.mu.Lock()
	m.oldest, m.measuredAt, m.failing = s.OldestAge, m.now(), false
	m.mu.Unlock()
}

// RecoveryPassFailed counts a failed recovery pass. Until a pass succeeds
// again the oldest stuck age keeps growing from its last measured value:
// whatever was stuck then is older now, and while the database cannot be
// read nothing shows it was settled, so an outage must not freeze the
// gauge an operator's alert watches. (With nothing stuck when passes began
// to fail, it grows from zero: the time recovery has been blind.)
func (m *Metrics) RecoveryPassFailed(error) {
	m.passFailures.Inc()
	m.mu.Lock()
	if !m.failing {
		m.failing = true
		if m.measuredAt.IsZero() {
			m.measuredAt = m.now()
		}
	}
	m.mu.Unlock()
}

// stuckOldestAge is the value of chargeonce_stuck_oldest_age_seconds.
func (m *Metrics) stuckOldestAge() float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.failing {
		return (m.oldest + m.now().Sub(m.measuredAt)).Seconds()
	}
	return m.oldest.Seconds()
}

// Handler serves the registry in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

// Connections exports the connection statistics of the listener named
// listener ("api", "metrics"), read at every scrape: open connections, the
// cap, and the connections refused and evicted at the cap.
func (m *Metrics) Connections(listener string, stats func() httpserve.Stats) {
	labels := prometheus.Labels{"listener": listener}
	gauge := func(name, help string, v func(httpserve.Stats) float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: labels}, func() float64 { return v(stats()) })
	}
	counter := func(name, help string, v func(httpserve.Stats) float64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels}, func() float64 { return v(stats()) })
	}
	m.reg.MustRegister(
		gauge("chargeonce_http_connections_open", "Open HTTP connections, by listener.", func(s httpserve.Stats) float64 { return float64(s.Open) }),
		gauge("chargeonce_http_connections_max", "The most HTTP connections a listener keeps open (--max-conns, lowered to fit the file descriptor limit).", func(s httpserve.Stats) float64 { return float64(s.Max) }),
		counter("chargeonce_http_connections_refused_total", "Connections answered 503 and closed at once: the cap was reached and every open connection was serving a request.", func(s httpserve.Stats) float64 { return float64(s.Refused) }),
		counter("chargeonce_http_connections_evicted_total", "Idle connections closed to make room for a new one at the cap (an idle-connection flood, or too small a --max-conns).", func(s httpserve.Stats) float64 { return float64(s.Evicted) }),
	)
}
