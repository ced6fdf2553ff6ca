package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/chargeonce/chargeonce"
)

// Webhooks holds the webhook sender's metrics. It implements
// webhook.Observer.
type Webhooks struct {
	deliveries  *prometheus.CounterVec
	latency     prometheus.Histogram
	disabled    prometheus.Counter
	pending     prometheus.Gauge
	oldest      prometheus.Gauge
	disabledNow prometheus.Gauge
}

// Webhooks registers the webhook sender's metrics in m's registry and
// returns them. Call it once per Metrics.
func (m *Metrics) Webhooks() *Webhooks {
	w := &Webhooks{
		deliveries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "chargeonce_webhook_deliveries_total",
			Help: "Webhook delivery attempts, by result (delivered, failed, error, gone).",
		}, []string{"result"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "chargeonce_webhook_delivery_seconds",
			Help:    "Time from sending a webhook delivery to its answer (or its failure).",
			Buckets: []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 15},
		}),
		disabled: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "chargeonce_webhook_endpoints_disabled_total",
			Help: "Webhook endpoints this instance disabled (410 Gone, or failing for 3 days).",
		}),
		pending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "chargeonce_webhook_queue_depth",
			Help: "Webhook deliveries not yet made (due or waiting for a retry).",
		}),
		oldest: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "chargeonce_webhook_oldest_undelivered_age_seconds",
			Help: "Age of the oldest webhook delivery not yet made.",
		}),
		disabledNow: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "chargeonce_webhook_endpoints_disabled",
			Help: "Webhook endpoints disabled now, in every instance's database.",
		}),
	}
	m.reg.MustRegister(w.deliveries, w.latency, w.disabled, w.pending, w.oldest, w.disabledNow)
	return w
}

// Delivery implements webhook.Observer.
func (w *Webhooks) Delivery(result string, latency time.Duration) {
	w.deliveries.WithLabelValues(result).Inc()
	w.latency.Observe(latency.Seconds())
}

// EndpointDisabled implements webhook.Observer.
func (w *Webhooks) EndpointDisabled() { w.disabled.Inc() }

// WebhookStats implements webhook.Observer.
func (w *Webhooks) WebhookStats(st chargeonce.WebhookStats) {
	w.pending.Set(float64(st.Pending))
	w.oldest.Set(st.OldestPendingAge.Seconds())
	w.disabledNow.Set(float64(st.EndpointsDisabled))
}
