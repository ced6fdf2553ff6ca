// Package metrics exposes chargeonce's Prometheus metrics: answers by status
// and replay, acquirer latency and errors, and the orphan gauges operators
// watch for stuck charges.
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
)

// Metrics implements engine.Observer and httpapi.OutcomeObserver, and
// serves the registry.
type Metrics struct {
	reg          *prometheus.Registry
	outcomes     *prometheus.CounterVec
	acquirer     *prometheus.HistogramVec
	stuckCount   prometheus.Gauge
	passFailures prometheus.Counter
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
		cache: map[[2]int]prometheus.Counter{},
		now:   time.Now,
	}
	stuckOldest := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "chargeonce_stuck_oldest_age_seconds",
		Help: "Age of the oldest processing record whose lease has ended. While recovery passes fail it keeps growing from its last measured value.",
	}, m.stuckOldestAge)
	m.reg.MustRegister(m.outcomes, m.acquirer, m.stuckCount, stuckOldest, m.passFailures,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
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

// AcquirerCall implements engine.Observer.
func (m *Metrics) AcquirerCall(d time.Duration, err error) {
	result := "ok"
	if err != nil {
		result = "unknown"
	}
	m.acquirer.WithLabelValues(result).Observe(d.Seconds())
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
