package engine

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Rate is how many charge attempts per second one merchant may start, in
// bursts of up to Burst: a token bucket.
type Rate struct {
	PerSecond float64
	Burst     int
}

// Defaults of `serve`'s and `worker`'s --merchant-rate and --merchant-burst,
// per instance: a thousand charge attempts a second is far beyond what a
// merchant's checkout sends (bursts of two thousand absorb a batch of
// retries), yet a fraction of what one instance serves, so that a runaway
// client of one merchant cannot take the database from the others. A
// merchant that needs more gets its own rate in the API keys file. An
// Engine built with a zero Options.MerchantRate applies no rate at all.
const (
	DefaultMerchantRate  = 1000
	DefaultMerchantBurst = 2000
)

// IsZero reports whether r sets no limit.
func (r Rate) IsZero() bool { return r.PerSecond == 0 && r.Burst == 0 }

// Validate reports a rate that cannot be applied.
func (r Rate) Validate() error {
	switch {
	case math.IsNaN(r.PerSecond) || math.IsInf(r.PerSecond, 0) || r.PerSecond <= 0:
		return fmt.Errorf("the rate must be a positive number of attempts per second; got %v", r.PerSecond)
	case r.Burst < 1:
		return fmt.Errorf("the burst must be at least 1; got %d", r.Burst)
	}
	return nil
}

// String formats r as ParseRate reads it.
func (r Rate) String() string {
	return strconv.FormatFloat(r.PerSecond, 'g', -1, 64) + "/s burst " + strconv.Itoa(r.Burst)
}

// ParsePerSecond reads a rate given as "200", "200/s", "12000/m" or
// "720000/h", as attempts per second.
func ParsePerSecond(s string) (float64, error) {
	num, unit, _ := strings.Cut(strings.TrimSpace(s), "/")
	per := time.Second
	switch unit {
	case "", "s":
	case "m":
		per = time.Minute
	case "h":
		per = time.Hour
	default:
		return 0, fmt.Errorf("rate %q: the unit after / must be s, m or h", s)
	}
	n, err := strconv.ParseFloat(num, 64)
	if err != nil || math.IsNaN(n) || math.IsInf(n, 0) || n <= 0 {
		return 0, fmt.Errorf("rate %q must be a positive number of attempts, optionally per s, m or h (as in 200/s)", s)
	}
	return n / per.Seconds(), nil
}

// rateLimits holds one token bucket per merchant, made on the merchant's
// first attempt with its own rate or the default.
type rateLimits struct {
	def      Rate
	merchant map[string]Rate
	buckets  sync.Map // merchant id -> *rate.Limiter
}

func newRateLimits(def Rate, merchant map[string]Rate) *rateLimits {
	if def.IsZero() && len(merchant) == 0 {
		return nil
	}
	return &rateLimits{def: def, merchant: merchant}
}

// allow takes one token from merchant's bucket. When there is none it
// returns false and when the next one comes.
func (r *rateLimits) allow(merchant string) (ok bool, retryAfter time.Duration) {
	if r == nil {
		return true, 0
	}
	v, found := r.buckets.Load(merchant)
	if !found {
		shape, own := r.merchant[merchant]
		if !own {
			shape = r.def
		}
		if shape.IsZero() {
			return true, 0
		}
		v, _ = r.buckets.LoadOrStore(merchant, rate.NewLimiter(rate.Limit(shape.PerSecond), shape.Burst))
	}
	lim := v.(*rate.Limiter)
	if lim.Allow() {
		return true, 0
	}
	missing := 1 - lim.Tokens()
	return false, time.Duration(missing / float64(lim.Limit()) * float64(time.Second))
}
