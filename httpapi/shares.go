package httpapi

import (
	"net/http"
	"sync"
	"time"

	"github.com/chargeonce/chargeonce"
)

// MaxBodyReadsPerMerchant is how many request bodies of one merchant may be
// arriving at once. A body comes with its headers from a client that is
// not hostile, so this only binds a merchant (or a leaked key) trickling
// bodies: past it, a request waits up to ReadShareWait for a share, then is answered
// 429 before its body is read, and
// the merchant cannot hold more than its share of the listener's
// connections (SPEC "Tenants share the service fairly").
// A burst of ordinary requests (50 refunds at once) only waits a moment
// for a share: each is held while a body already sent is copied in.
const MaxBodyReadsPerMerchant = 16

// Defaults of Config.MaxReadsPerMerchant and the wait for a share.
const (
	// DefaultMaxReadsPerMerchant is how many reads (GET /v1/…) of one
	// merchant run at once. Each holds a database connection while it
	// runs: a merchant polling with 64 loops would otherwise hold the whole
	// pool, and every other merchant's charges would queue behind it.
	DefaultMaxReadsPerMerchant = 4
	// ReadShareWait is how long a read waits for one of its merchant's
	// shares before it is answered 429 with Retry-After.
	ReadShareWait = time.Second
	// maxReadWaitersPerShare bounds the reads waiting, per share: past it a
	// read is answered 429 at once rather than hold a connection waiting.
	maxReadWaitersPerShare = 16
)

// readShares gives each merchant a fixed number of what it counts in
// flight (reads, bodies arriving); more wait their turn, briefly, in their
// merchant's queue only.
type readShares struct {
	per  int
	what string
	mu   sync.Mutex
	m    map[string]*readShare
}

type readShare struct {
	slots   chan struct{}
	waiting int
}

func newReadShares(per int, what string) *readShares {
	return &readShares{per: per, what: what, m: map[string]*readShare{}}
}

// take waits up to ReadShareWait for one of merchant's slots.
func (rs *readShares) take(r *http.Request, merchant string) (release func(), err error) {
	rs.mu.Lock()
	sh := rs.m[merchant]
	if sh == nil {
		sh = &readShare{slots: make(chan struct{}, rs.per)}
		rs.m[merchant] = sh
	}
	rs.mu.Unlock()
	release = func() { <-sh.slots }
	select {
	case sh.slots <- struct{}{}:
		return release, nil
	default:
	}
	rs.mu.Lock()
	if sh.waiting >= rs.per*maxReadWaitersPerShare {
		rs.mu.Unlock()
		return nil, rs.refusal()
	}
	sh.waiting++
	rs.mu.Unlock()
	defer func() {
		rs.mu.Lock()
		sh.waiting--
		rs.mu.Unlock()
	}()
	t := time.NewTimer(ReadShareWait)
	defer t.Stop()
	select {
	case sh.slots <- struct{}{}:
		return release, nil
	case <-t.C:
		return nil, rs.refusal()
	case <-r.Context().Done():
		return nil, chargeonce.Errorf(chargeonce.EUNAVAILABLE, "the client went away while waiting")
	}
}

func (rs *readShares) refusal() error {
	e := chargeonce.Errorf(chargeonce.ERATELIMITED, "this merchant already has %d %s in flight, its share; retry after the time in Retry-After", rs.per, rs.what)
	e.RetryAfter = time.Second
	return e
}
