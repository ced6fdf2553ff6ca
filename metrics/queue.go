package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/chargeonce/chargeonce"
)

// Queue holds the queue worker's metrics. It implements queue.Observer.
type Queue struct {
	messages     *prometheus.CounterVec
	redeliveries prometheus.Counter
	dead         *prometheus.CounterVec
	published    prometheus.Counter
	depth        prometheus.Gauge
	oldest       prometheus.Gauge
}

// Queue registers the queue worker's metrics in m's registry and returns
// them. Call it once per Metrics.
func (m *Metrics) Queue() *Queue {
	q := &Queue{
		messages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "chargeonce_queue_messages_total",
			Help: "Charge request deliveries handled by the worker, by outcome (answered, replayed, outbox, in_progress, rejected, poison, error, gave_up, delayed).",
		}, []string{"outcome"}),
		redeliveries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "chargeonce_queue_redeliveries_total",
			Help: "Charge request deliveries that were not the message's first.",
		}),
		dead: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "chargeonce_queue_dead_letters_total",
			Help: "Charge requests copied to charges.dead.<merchant>, by reason (the problem slug, or max-deliveries).",
		}, []string{"reason"}),
		published: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "chargeonce_outbox_published_total",
			Help: "Results published from the outbox (settled after their request was acked).",
		}),
		depth: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "chargeonce_outbox_depth",
			Help: "Results in the outbox not yet published.",
		}),
		oldest: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "chargeonce_outbox_oldest_age_seconds",
			Help: "Age of the oldest result in the outbox not yet published.",
		}),
	}
	m.reg.MustRegister(q.messages, q.redeliveries, q.dead, q.published, q.depth, q.oldest)
	return q
}

// Message implements queue.Observer.
func (q *Queue) Message(outcome string, redelivered bool) {
	q.messages.WithLabelValues(outcome).Inc()
	if redelivered {
		q.redeliveries.Inc()
	}
}

// DeadLetter implements queue.Observer.
func (q *Queue) DeadLetter(reason string) { q.dead.WithLabelValues(reason).Inc() }

// Outbox implements queue.Observer.
func (q *Queue) Outbox(st chargeonce.OutboxStats, published int) {
	q.published.Add(float64(published))
	q.depth.Set(float64(st.Count))
	q.oldest.Set(st.OldestAge.Seconds())
}
