package admin_test

import (
	"context"
	"testing"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/admin"
)

type operatorStore interface {
	chargeonce.Store
	chargeonce.OperatorStore
}

// hangUpDuringClaim commits the resolution's claim and then, the
// operator having hung up meanwhile, reports the context's error, as pgx
// does when the context ends before the answer is read.
type hangUpDuringClaim struct {
	operatorStore
	hangUp context.CancelFunc
}

func (s *hangUpDuringClaim) ChargeResolveClaim(ctx context.Context, chargeID, newToken string, lease time.Duration) (chargeonce.KeyRecord, error) {
	rec, err := s.operatorStore.ChargeResolveClaim(context.WithoutCancel(ctx), chargeID, newToken, lease)
	if err != nil {
		return rec, err
	}
	s.hangUp()
	if ctx.Err() != nil {
		return chargeonce.KeyRecord{}, ctx.Err()
	}
	return rec, nil
}

// TestResolveOperatorHangsUpDuringClaim: an operator whose connection
// ends while the resolution's claim is on the wire still gets the charge
// resolved, not left claimed by a resolution nobody finishes (the
// merchant's retries answer 409 for the whole lease, here a minute).
func TestResolveOperatorHangsUpDuringClaim(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"postgres", "sqlite"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			e := setup(t, kind)
			id, _ := e.stuck(t, "hang-up")
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			st := &hangUpDuringClaim{operatorStore: e.store.(operatorStore), hangUp: cancel}
			srv, err := admin.New(admin.Config{Store: st, Acquirer: e.acq, Finality: e.sim, Keys: adminKeys(t), Lease: time.Minute, AcquirerTimeout: time.Second, Logger: newLogger(e.logs)})
			if err != nil {
				t.Fatal(err)
			}
			_, rerr := srv.Resolve(ctx, "alice", id, admin.ResolveRequest{Status: chargeonce.StatusDeclined, Reason: "the acquirer never saw it, ticket 7"})
			ch, err := e.store.ChargeGet(t.Context(), "demo", id)
			if err != nil {
				t.Fatal(err)
			}
			if ch.Status != chargeonce.StatusDeclined {
				t.Fatalf("after the operator hung up during the claim (Resolve: %v): the charge is %s, claimed for a minute by a resolution nobody finishes", rerr, ch.Status)
			}
		})
	}
}
