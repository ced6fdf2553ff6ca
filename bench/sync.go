package bench

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/idempotency"
	"github.com/chargeonce/chargeonce/sqlite"
)

// syncModes are the SQLite synchronous settings the sync comparison runs:
// the store's own (FULL: a committed record survives power loss) and the
// NORMAL that WAL is usually paired with (faster; a commit may roll back on
// power loss).
var syncModes = []string{"FULL", "NORMAL"}

// syncResult is the write cost of synchronous=FULL: new charges through the
// store (insert the record and its charge, then store the final answer: the
// two commits of a new charge) per second under each mode.
type syncResult struct {
	clients int
	per     time.Duration // measured per mode and round
	rounds  int
	charges map[string]int64
	took    map[string]time.Duration
}

func (r *syncResult) rate(mode string) float64 {
	if r.took[mode] <= 0 {
		return 0
	}
	return float64(r.charges[mode]) / r.took[mode].Seconds()
}

// measureSync measures, on SQLite, the store's new-charge rate with
// synchronous=FULL against NORMAL on a fresh file of its own, in the same
// run, interleaved round by round. It runs the store's methods directly
// (no HTTP, no acquirer), so the difference is the commits' syncs.
func (b *bench) measureSync(ctx context.Context) error {
	db, err := b.newDatabase(ctx, "_sync")
	if err != nil {
		return err
	}
	s, err := sqlite.Open(ctx, strings.TrimPrefix(db, "sqlite:"))
	if err != nil {
		return fmt.Errorf("sync comparison: %w", err)
	}
	defer s.Close()
	if err := s.Migrate(ctx); err != nil {
		return fmt.Errorf("sync comparison: %w", err)
	}
	wdb, _ := s.DBs()
	r := &syncResult{
		clients: b.ratioClients(),
		per:     b.cfg.Duration / time.Duration(b.cfg.Rounds),
		rounds:  b.cfg.Rounds,
		charges: map[string]int64{},
		took:    map[string]time.Duration{},
	}
	var seq atomic.Int64
	b.logf("sync comparison: synchronous=FULL against NORMAL, %d clients, %d rounds of %s each", r.clients, r.rounds, r.per)
	for range r.rounds {
		for _, mode := range syncModes {
			// The store writes through exactly one connection, so the
			// pragma holds for every write that follows.
			if _, err := wdb.ExecContext(ctx, "PRAGMA synchronous = "+mode); err != nil {
				return fmt.Errorf("sync comparison: setting synchronous=%s: %w", mode, err)
			}
			n, took, err := newCharges(ctx, s, r.clients, r.per, &seq)
			if err != nil {
				return fmt.Errorf("sync comparison, synchronous=%s: %w", mode, err)
			}
			r.charges[mode] += n
			r.took[mode] += took
		}
	}
	if _, err := wdb.ExecContext(ctx, "PRAGMA synchronous = FULL"); err != nil {
		return fmt.Errorf("sync comparison: %w", err)
	}
	b.sync = r
	return nil
}

// newCharges runs closed-loop clients making new charges through the store
// for d, and returns how many completed and how long it took.
func newCharges(ctx context.Context, s *sqlite.Store, clients int, d time.Duration, seq *atomic.Int64) (int64, time.Duration, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		done     atomic.Int64
		wg       sync.WaitGroup
		errOnce  sync.Once
		firstErr error
	)
	body := []byte(`{"status":"captured"}`)
	start := time.Now()
	deadline := start.Add(d)
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) && ctx.Err() == nil {
				key := fmt.Sprintf("sync-%d", seq.Add(1))
				token := idempotency.NewToken()
				_, _, err := s.KeyInsert(ctx, chargeonce.KeyInsertParams{
					Fingerprint: bareFingerprint, Token: token, Lease: bareLease,
					Charge: chargeonce.Charge{
						ID: idempotency.NewChargeID(), MerchantID: merchant, IdempotencyKey: key,
						OrderID: 1, AmountCents: benchAmount, Currency: benchCurrency, PaymentToken: benchToken,
					},
				})
				if err == nil {
					err = s.KeyComplete(ctx, chargeonce.KeyCompleteParams{
						MerchantID: merchant, Key: key, Token: token, ChargeStatus: chargeonce.StatusCaptured,
						ResponseStatus: 201, ResponseBody: body, TTL: bareTTL,
					})
				}
				if err != nil {
					errOnce.Do(func() { firstErr = err; cancel() })
					return
				}
				done.Add(1)
			}
		}()
	}
	wg.Wait()
	return done.Load(), time.Since(start), firstErr
}

// reportSync prints the sync comparison, if the run made one.
func (b *bench) reportSync(w io.Writer) {
	r := b.sync
	if r == nil {
		return
	}
	full, normal := r.rate("FULL"), r.rate("NORMAL")
	ratio := "n/a"
	if normal > 0 {
		ratio = fmt.Sprintf("%.2f", full/normal)
	}
	fmt.Fprintf(w, "\nsqlite-sync: new charges through the store at %d clients (%d rounds of %s per mode): synchronous=FULL %.0f/s, NORMAL %.0f/s: FULL/NORMAL=%s (the store runs FULL: NORMAL may roll back commits on power loss)\n",
		r.clients, r.rounds, r.per, full, normal, ratio)
}
