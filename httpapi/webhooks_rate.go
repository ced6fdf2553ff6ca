package httpapi

import (
	"net/http"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/engine"
)

// DefaultWebhooksRate is each merchant's rate on the webhook and event
// routes, per instance, when Config.WebhooksRate is zero: far more than a
// dashboard or a script managing endpoints needs, and little enough that
// no merchant can flood the deliveries table or the database with them
// (27,017 redeliveries in 40 s once left 432,288 pending deliveries).
var DefaultWebhooksRate = engine.Rate{PerSecond: 20, Burst: 40}

// webhookLimits is one token bucket per merchant for the webhook and event
// routes. Merchants are the API keys' (authenticated first), so the map is
// bounded.
type webhookLimits struct {
	shape   engine.Rate
	buckets sync.Map // merchant id -> *rate.Limiter
}

// allow takes a token from merchant's bucket, or says when the next comes.
func (l *webhookLimits) allow(merchant string) (bool, time.Duration) {
	v, ok := l.buckets.Load(merchant)
	if !ok {
		v, _ = l.buckets.LoadOrStore(merchant, rate.NewLimiter(rate.Limit(l.shape.PerSecond), l.shape.Burst))
	}
	lim := v.(*rate.Limiter)
	if lim.Allow() {
		return true, 0
	}
	// At least a moment: Tokens may have refilled since Allow said no.
	missing := 1 - lim.Tokens()
	return false, max(time.Duration(missing/float64(lim.Limit())*float64(time.Second)), time.Millisecond)
}

// webhookAuth authenticates r for a webhook or event route and takes one of
// its merchant's tokens: 401, or 429 with Retry-After over the rate. false
// when it has answered.
func (s *Server) webhookAuth(w http.ResponseWriter, r *http.Request) (chargeonce.Merchant, bool) {
	merchant, err := s.keys.authenticate(r)
	if err != nil {
		s.writeError(w, r, err)
		return chargeonce.Merchant{}, false
	}
	if ok, wait := s.webhookRate.allow(merchant.ID); !ok {
		s.writeError(w, r, &chargeonce.Error{
			Code: chargeonce.ERATELIMITED,
			Message: "this merchant is over its rate on the webhook and event routes (" + s.webhookRate.shape.String() +
				"): retry after the time in Retry-After",
			RetryAfter: wait,
		})
		return chargeonce.Merchant{}, false
	}
	return merchant, true
}
