package postgres_test

import (
	"context"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/chargeonce/chargeonce/internal/pgtest"
)

// seedKeys fills idempotency_keys (schema 0001) with n records in one
// statement, the way a database in the field looks: records created over
// the last day with a TTL of 24 h fixed at insert, settled milliseconds
// later; one in a hundred still processing, one in a hundred settled late
// (after the expiry fixed at its insert). Keys are k0 … k(n-1) of merchant m.
func seedKeys(t testing.TB, conn *pgx.Conn, n int) {
	t.Helper()
	ctx := context.Background()
	// Indexes built once after the load are much faster than n inserts
	// into them.
	if _, err := conn.Exec(ctx, `DROP INDEX idempotency_keys_lease_until_idx, idempotency_keys_expires_at_idx`); err != nil {
		t.Fatalf("seeding: %v", err)
	}
	if _, err := conn.Exec(ctx, `
		INSERT INTO idempotency_keys (merchant_id, key, fingerprint, token, state, lease_until,
			response_status, response_body, charge_id, created_at, updated_at, expires_at)
		SELECT 'm', 'k' || i, 'fp', 't' || i,
		       CASE WHEN i % 100 = 0 THEN 'processing' ELSE 'completed' END,
		       c + interval '30s',
		       CASE WHEN i % 100 = 0 THEN NULL ELSE 201 END,
		       CASE WHEN i % 100 = 0 THEN NULL ELSE '{"id":"ch_x","status":"captured"}'::bytea END,
		       'ch_' || i, c,
		       CASE WHEN i % 100 = 1 THEN c + interval '25h' ELSE c + interval '5ms' END,
		       c + interval '24h'
		FROM (SELECT i, now() - (i % 86400) * interval '1s' AS c FROM generate_series(0, $1 - 1) AS i) AS s`, n); err != nil {
		t.Fatalf("seeding %d records: %v", n, err)
	}
	if _, err := conn.Exec(ctx, `CREATE INDEX idempotency_keys_lease_until_idx ON idempotency_keys (lease_until) WHERE state = 'processing';
		CREATE INDEX idempotency_keys_expires_at_idx ON idempotency_keys (expires_at)`); err != nil {
		t.Fatalf("seeding: %v", err)
	}
	if _, err := conn.Exec(ctx, `ANALYZE idempotency_keys`); err != nil {
		t.Fatalf("analyzing the seeded table: %v", err)
	}
}

// TestMigrateOnline migrates a table of a million records written under
// 0001 to the latest schema while a reader looks records up every 10 ms, as
// traffic does: no lookup may wait more than 100 ms for a lock. A migration that scans
// the table under an exclusive lock (an UPDATE in the transaction of an
// ALTER TABLE) blocks every reader for the whole scan.
func TestMigrateOnline(t *testing.T) {
	t.Parallel()
	const (
		rows     = 1_000_000
		probe    = 10 * time.Millisecond
		maxStall = 100 * time.Millisecond
	)
	ctx := t.Context()
	url := pgtest.URL(t)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	schemaAt(t, conn, 1)
	start := time.Now()
	seedKeys(t, conn, rows)
	t.Logf("seeded %d records in %v", rows, time.Since(start).Round(time.Millisecond))

	reader, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close(context.Background())
	// A read that waits longer than maxStall for a lock fails (55P03): a
	// stall the migration causes, told apart from a slow read on a loaded
	// machine, whose time is only logged.
	if _, err := reader.Exec(ctx, "SET lock_timeout = '"+strconv.Itoa(int(maxStall.Milliseconds()))+"ms'"); err != nil {
		t.Fatal(err)
	}
	var (
		wg    sync.WaitGroup
		waits []time.Duration
		rerr  error
	)
	stop := make(chan struct{})
	probeOnce := func() error {
		var state string
		began := time.Now()
		err := reader.QueryRow(ctx, `SELECT state FROM idempotency_keys WHERE merchant_id = $1 AND key = $2`,
			"m", "k"+strconv.Itoa(rand.IntN(rows))).Scan(&state)
		waits = append(waits, time.Since(began))
		return err
	}
	if err := probeOnce(); err != nil { // warm the reader's connection
		t.Fatalf("probing: %v", err)
	}
	waits = waits[:0]
	wg.Go(func() {
		tick := time.NewTicker(probe)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			if err := probeOnce(); err != nil {
				rerr = err
				return
			}
		}
	})

	s := open(t, url)
	start = time.Now()
	mctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	err = s.Migrate(mctx)
	took := time.Since(start)
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	if rerr != nil {
		t.Fatalf("a lookup during Migrate: %v; want none blocked by a lock for %v", rerr, maxStall)
	}
	slices.Sort(waits)
	if len(waits) == 0 {
		t.Fatal("no lookup ran during Migrate")
	}
	worst := waits[len(waits)-1]
	t.Logf("Migrate of %d records took %v; %d lookups: median %v, p99 %v, max %v",
		rows, took.Round(time.Millisecond), len(waits), waits[len(waits)/2].Round(time.Microsecond),
		waits[len(waits)*99/100].Round(time.Microsecond), worst.Round(time.Microsecond))

}
