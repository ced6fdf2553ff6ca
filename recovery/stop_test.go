package recovery_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/recovery"
)

// cancelDuringClaim commits its first claim and then ends the pass's
// context before answering; like pgx when the context ends before the
// answer is read, it then reports the context's error.
type cancelDuringClaim struct {
	chargeonce.Store
	once   sync.Once
	cancel context.CancelFunc
}

func (s *cancelDuringClaim) KeysClaimExpired(ctx context.Context, lease time.Duration, limit int) ([]chargeonce.KeyRecord, error) {
	recs, err := s.Store.KeysClaimExpired(context.WithoutCancel(ctx), lease, limit)
	if err != nil || len(recs) == 0 {
		return recs, err
	}
	s.once.Do(s.cancel)
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	return recs, nil
}

// TestStopDuringClaimStillDrives stops a pass while its claim is on the
// wire: the records it claimed are driven to their answer before the pass
// returns, as the records of a pass already claimed are, not left claimed
// for a whole lease (here a minute) while nobody drives them.
func TestStopDuringClaimStillDrives(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	st := &cancelDuringClaim{cancel: cancel}
	e := setup(t, func(s chargeonce.Store) chargeonce.Store { st.Store = s; return st }, engine.Options{Lease: time.Minute})
	req := request("tok_ok")
	orphan(t, e.store, "stopped-mid-claim", req)
	r := recovery.NewRescuer(e.store, e.eng, recovery.RescuerOptions{})
	res, err := r.RunOnce(ctx)
	if rec := get(t, e.store, "stopped-mid-claim"); rec.State != chargeonce.KeyCompleted {
		t.Fatalf("after a pass stopped during its claim (%+v, %v): the record is %s, claimed for a minute and driven by no one", res, err, rec.State)
	}
	if n := e.sim.CapturedCount("demo", req.OrderID); n != 1 {
		t.Fatalf("captured %d times, want 1", n)
	}
}
