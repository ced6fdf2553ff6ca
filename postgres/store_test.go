package postgres_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/internal/pgtest"
	"github.com/chargeonce/chargeonce/postgres"
	"github.com/chargeonce/chargeonce/storetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(pgtest.M(m)) }

// testMaxConns keeps each test's pool small: dozens of tests run in
// parallel against one server.
const testMaxConns = 8

// open opens a store on connURL and closes it in t.Cleanup.
func open(t testing.TB, connURL string) *postgres.Store {
	t.Helper()
	s, err := postgres.Open(context.Background(), connURL, postgres.WithMaxConns(testMaxConns))
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// setup returns a migrated store in a schema of its own.
func setup(t testing.TB) *postgres.Store {
	t.Helper()
	s := open(t, pgtest.URL(t))
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	return s
}

func TestStore(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T) chargeonce.Store { return setup(t) })
}

func TestOperators(t *testing.T) {
	t.Parallel()
	storetest.RunOperators(t, func(t *testing.T) chargeonce.Store { return setup(t) })
}

// TestMigrateConcurrent starts several instances at once on one empty
// schema, each migrating: the advisory lock must make them take turns, so
// every migration is applied exactly once and nobody fails.
func TestMigrateConcurrent(t *testing.T) {
	t.Parallel()
	connURL := pgtest.URL(t)
	const instances = 8
	stores := make([]*postgres.Store, instances)
	for i := range stores {
		stores[i] = open(t, connURL)
	}
	errs := make([]error, instances)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i, s := range stores {
		wg.Go(func() {
			<-start
			errs[i] = s.Migrate(t.Context())
		})
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("instance %d: Migrate: %v", i, err)
		}
	}

	var applied, distinct int
	err := stores[0].Pool().QueryRow(t.Context(),
		"SELECT count(*), count(DISTINCT version) FROM schema_migrations").Scan(&applied, &distinct)
	if err != nil {
		t.Fatal(err)
	}
	if applied == 0 || applied != distinct {
		t.Fatalf("schema_migrations has %d rows for %d versions", applied, distinct)
	}
	// And the schema works.
	p := chargeonce.KeyInsertParams{
		Fingerprint: "fp", Token: "tok", Lease: time.Minute,
		Charge: chargeonce.Charge{ID: "ch_1", MerchantID: "m", IdempotencyKey: "k", OrderID: 1, AmountCents: 1, Currency: "BRL", PaymentToken: "tok_ok"},
	}
	if _, inserted, err := stores[instances-1].KeyInsert(t.Context(), p); err != nil || !inserted {
		t.Fatalf("KeyInsert after concurrent migrations: inserted=%v err=%v", inserted, err)
	}
}

// TestMigrateCreatesInSearchPath checks that the schema lands in the
// connection's schema, not in public.
func TestMigrateCreatesInSearchPath(t *testing.T) {
	t.Parallel()
	s := setup(t)
	var schema string
	var tables []string
	err := s.Pool().QueryRow(t.Context(), "SELECT current_schema()").Scan(&schema)
	if err != nil {
		t.Fatal(err)
	}
	rows, err := s.Pool().Query(t.Context(),
		"SELECT tablename FROM pg_tables WHERE schemaname = $1 ORDER BY tablename", schema)
	if err != nil {
		t.Fatal(err)
	}
	tables, err = pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(tables, ","), "charge_history,charge_operations,charges,idempotency_keys,outbox,recon_acks,recon_run_merchants,recon_runs,refunds,schema_migration_steps,schema_migrations,webhook_attempts,webhook_deliveries,webhook_endpoints,webhook_events"; got != want {
		t.Fatalf("tables in %s: %s, want %s", schema, got, want)
	}
}

// TestConflictReadTakesNoLock pins why the existing record is read with a
// plain SELECT: a retry must get its answer at once even while another
// session holds a lock on the record's row.
func TestConflictReadTakesNoLock(t *testing.T) {
	t.Parallel()
	s := setup(t)
	ctx := t.Context()
	p := chargeonce.KeyInsertParams{
		Fingerprint: "fp", Token: "tok_first", Lease: time.Minute,
		Charge: chargeonce.Charge{ID: "ch_1", MerchantID: "m", IdempotencyKey: "k", OrderID: 1, AmountCents: 1, Currency: "BRL", PaymentToken: "tok_ok"},
	}
	if _, inserted, err := s.KeyInsert(ctx, p); err != nil || !inserted {
		t.Fatalf("KeyInsert: inserted=%v err=%v", inserted, err)
	}

	tx, err := s.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }() // the test ends the lock; its outcome is of no interest
	if _, err := tx.Exec(ctx, "SELECT 1 FROM idempotency_keys WHERE merchant_id = 'm' AND key = 'k' FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "SELECT 1 FROM charges WHERE id = 'ch_1' FOR UPDATE"); err != nil {
		t.Fatal(err)
	}

	quick, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	retry := p
	retry.Token, retry.Charge.ID = "tok_retry", "ch_2"
	rec, inserted, err := s.KeyInsert(quick, retry)
	if err != nil || inserted || rec.Token != "tok_first" {
		t.Fatalf("KeyInsert while the row is locked: inserted=%v token=%s err=%v; want the first record at once", inserted, rec.Token, err)
	}
	if _, err := s.KeyGet(quick, "m", "k"); err != nil {
		t.Fatalf("KeyGet while the row is locked: %v", err)
	}
}

func TestOpenOptions(t *testing.T) {
	t.Parallel()
	connURL := pgtest.URL(t)

	if got := open(t, connURL).Pool().Config().MaxConns; got != testMaxConns {
		t.Errorf("WithMaxConns(%d): MaxConns = %d", testMaxConns, got)
	}
	s, err := postgres.Open(t.Context(), connURL)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got := s.Pool().Config().MaxConns; got != postgres.DefaultMaxConns {
		t.Errorf("default MaxConns = %d, want %d", got, postgres.DefaultMaxConns)
	}
	s2, err := postgres.Open(t.Context(), connURL+"&pool_max_conns=3")
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if got := s2.Pool().Config().MaxConns; got != 3 {
		t.Errorf("pool_max_conns=3: MaxConns = %d", got)
	}
	if _, err := postgres.Open(t.Context(), connURL, postgres.WithMaxConns(0)); err == nil {
		t.Error("WithMaxConns(0): no error")
	}
	if _, err := postgres.Open(t.Context(), "postgres://nobody@127.0.0.1:1/nothing?sslmode=disable&connect_timeout=2"); err == nil {
		t.Error("Open of an unreachable server: no error")
	}
	if _, err := postgres.Open(t.Context(), "postgres://%zz"); err == nil {
		t.Error("Open of a malformed URL: no error")
	}
}

// BenchmarkKeyInsert measures the two hot paths: a new intent, and a
// retry that is answered from the stored record.
func BenchmarkKeyInsert(b *testing.B) {
	s := setup(b)
	ctx := context.Background()
	params := func(key string) chargeonce.KeyInsertParams {
		return chargeonce.KeyInsertParams{
			Fingerprint: "fp", Token: "tok_" + key, Lease: time.Minute,
			Charge: chargeonce.Charge{ID: "ch_" + key, MerchantID: "m", IdempotencyKey: key, OrderID: 1, AmountCents: 1, Currency: "BRL", PaymentToken: "tok_ok"},
		}
	}
	b.Run("new", func(b *testing.B) {
		i := 0
		for b.Loop() {
			i++
			if _, inserted, err := s.KeyInsert(ctx, params(fmt.Sprintf("new-%d", i))); err != nil || !inserted {
				b.Fatalf("inserted=%v err=%v", inserted, err)
			}
		}
	})
	b.Run("replay", func(b *testing.B) {
		if _, _, err := s.KeyInsert(ctx, params("replayed")); err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			if _, inserted, err := s.KeyInsert(ctx, params("replayed")); err != nil || inserted {
				b.Fatalf("inserted=%v err=%v", inserted, err)
			}
		}
	})
}
