package httpapi

import (
	"sync"
	"time"

	"github.com/chargeonce/chargeonce"
)

// MaxBodyReadsPerMerchant is how many request bodies of one merchant may be
// arriving at once. A body comes with its headers from a client that is
// not hostile, so this only binds a merchant (or a leaked key) trickling
// bodies: past it, a request is answered 429 before its body is read, and
// the merchant cannot hold more than its share of the listener's
// connections (SPEC "Tenants share the service fairly").
const MaxBodyReadsPerMerchant = 16

// shares counts what each merchant holds at once (bodies being read,
// reads in flight), against a per-merchant limit.
type shares struct {
	limit int
	what  string
	mu    sync.Mutex
	held  map[string]int
}

func newShares(limit int, what string) *shares {
	return &shares{limit: limit, what: what, held: map[string]int{}}
}

// take takes one of merchant's share, or answers ERATELIMITED when the
// merchant holds all of it. The release function gives it back.
func (s *shares) take(merchant string) (release func(), err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held[merchant] >= s.limit {
		e := chargeonce.Errorf(chargeonce.ERATELIMITED, "this merchant already has %d %s in flight; retry when one has finished", s.limit, s.what)
		e.RetryAfter = time.Second
		return nil, e
	}
	s.held[merchant]++
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.held[merchant]--; s.held[merchant] <= 0 {
			delete(s.held, merchant)
		}
	}, nil
}
