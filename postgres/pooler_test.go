package postgres_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/internal/pgtest"
	"github.com/chargeonce/chargeonce/postgres"
	"github.com/chargeonce/chargeonce/storetest"
)

// setupPooled returns a store that reaches a migrated schema of its own
// through a real PgBouncer in transaction mode. The schema is migrated over
// a direct connection, as docs/pooler.md tells operators to.
func setupPooled(t testing.TB) *postgres.Store {
	t.Helper()
	direct := pgtest.URL(t)
	migrator := open(t, direct)
	if err := migrator.Migrate(t.Context()); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	migrator.Close()
	return open(t, pgtest.PgBouncer(t, direct))
}

// TestStoreThroughPgBouncer runs the conformance suite, recovery's claims,
// the sweeper's deletes and the outbox included, through PgBouncer in
// transaction mode with no pooler-side setting: nothing in the startup
// packet, no session state, no named prepared statement.
func TestStoreThroughPgBouncer(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T) chargeonce.Store { return setupPooled(t) })
}

// TestStoreThroughPgBouncerManyStatements drives one statement shape many
// times over a small pool whose connections PgBouncer hands to different
// server connections: a named prepared statement cached on one client
// connection would meet a server connection that already has it (42P05)
// or lacks it (26000).
func TestStoreThroughPgBouncerManyStatements(t *testing.T) {
	t.Parallel()
	a := setupPooled(t)
	ctx := t.Context()
	for i := range 200 {
		p := chargeonce.KeyInsertParams{
			Fingerprint: "fp", Token: fmt.Sprintf("tok_%d", i), Lease: time.Minute,
			Charge: chargeonce.Charge{ID: fmt.Sprintf("ch_%d", i), MerchantID: "m", IdempotencyKey: fmt.Sprintf("k%d", i), OrderID: int64(i), AmountCents: 1, Currency: "BRL", PaymentToken: "tok_ok"},
		}
		if _, inserted, err := a.KeyInsert(ctx, p); err != nil || !inserted {
			t.Fatalf("KeyInsert %d: inserted=%v err=%v", i, inserted, err)
		}
		if _, err := a.KeyGet(ctx, "m", p.Charge.IdempotencyKey); err != nil {
			t.Fatalf("KeyGet %d: %v", i, err)
		}
	}
}

// TestMigrateThroughPgBouncerNeedsDirectURL: a schema with migrations to
// apply is refused through a pooler with an error that says what to do;
// an up-to-date schema is fine (serve checks it at every start).
func TestMigrateThroughPgBouncerNeedsDirectURL(t *testing.T) {
	t.Parallel()
	direct := pgtest.URL(t)
	pooled := open(t, pgtest.PgBouncer(t, direct))
	err := pooled.Migrate(t.Context())
	if err == nil || !strings.Contains(err.Error(), "direct") {
		t.Fatalf("Migrate of an empty schema through PgBouncer: %v; want an error asking for a direct URL", err)
	}
	t.Logf("through PgBouncer: %v", err)
	if err := open(t, direct).Migrate(t.Context()); err != nil {
		t.Fatalf("Migrate direct: %v", err)
	}
	if err := pooled.Migrate(t.Context()); err != nil {
		t.Fatalf("Migrate of an up-to-date schema through PgBouncer: %v", err)
	}
}

// Open sends statements unnamed behind a pooler, which hands each
// transaction to any server connection, and keeps pgx's named prepared
// statements on a direct connection, where they are faster.
func TestOpenChoosesExecModeByPooler(t *testing.T) {
	t.Parallel()
	direct := pgtest.URL(t)
	pooler := pgtest.PgBouncer(t, direct)
	withMode := func(u, mode string) string {
		sep := "?"
		if strings.Contains(u, "?") {
			sep = "&"
		}
		return u + sep + "default_query_exec_mode=" + mode
	}
	for _, tc := range []struct {
		name, url  string
		want       pgx.QueryExecMode
		wantPooled bool
	}{
		{"direct", direct, pgx.QueryExecModeCacheStatement, false},
		{"through PgBouncer", pooler, pgx.QueryExecModeCacheDescribe, true},
		// A URL's mode wins, and the store still knows where it runs
		// (bench --pooler refuses a URL that reaches PostgreSQL directly).
		{"through PgBouncer, the URL's mode", withMode(pooler, "exec"), pgx.QueryExecModeExec, true},
		{"direct, the URL's mode", withMode(direct, "exec"), pgx.QueryExecModeExec, false},
	} {
		s, err := postgres.Open(t.Context(), tc.url)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		got, pooled := s.Pool().Config().ConnConfig.DefaultQueryExecMode, s.Pooled()
		s.Close()
		if got != tc.want {
			t.Errorf("%s: exec mode %v; want %v", tc.name, got, tc.want)
		}
		if pooled != tc.wantPooled {
			t.Errorf("%s: Pooled() = %v; want %v", tc.name, pooled, tc.wantPooled)
		}
	}
}
