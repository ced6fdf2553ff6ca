package postgres_test

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/chargeonce/chargeonce/internal/pgtest"
	"github.com/chargeonce/chargeonce/postgres"
)

// TestMigrateWaitsAside migrates while a long transaction holds a lock on
// idempotency_keys (a report, a slow request): an ALTER TABLE waiting for it
// would queue every reader behind its own ACCESS EXCLUSIVE request. Migrate
// must wait aside (lock timeout, retry), so readers go on, and still finish
// once the long transaction ends.
func TestMigrateWaitsAside(t *testing.T) {
	t.Parallel()
	const (
		hold = 600 * time.Millisecond
		// A migration waiting in line behind the long transaction blocks
		// a read for the rest of the hold; one that waits aside blocks it
		// for at most its 50 ms lock_timeout, plus what a loaded machine
		// adds before that timer fires (over 100 ms was seen on CI).
		maxStall = hold / 2
	)
	ctx := t.Context()
	url := pgtest.URL(t)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	schemaAt(t, conn, 1)
	seedKeys(t, conn, 1000)

	long, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := long.Exec(ctx, `SELECT count(*) FROM idempotency_keys`); err != nil {
		t.Fatal(err)
	}
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

	s := open(t, url)
	migrated := make(chan error, 1)
	began := time.Now()
	go func() { migrated <- s.Migrate(ctx) }()
	// The long transaction ends after hold, whatever the reads below do;
	// conn is closed (deferred above) only after the rollback, when a read
	// below fails too.
	var rollback error
	rolledBack := make(chan struct{})
	time.AfterFunc(hold, func() { rollback = long.Rollback(context.Background()); close(rolledBack) })
	defer func() { <-rolledBack }()
	var (
		waits []time.Duration
		merr  error
	)
	for done := false; !done; {
		select {
		case merr = <-migrated:
			done = true
		case <-time.After(10 * time.Millisecond):
		}
		var state string
		t0 := time.Now()
		if err := reader.QueryRow(ctx, `SELECT state FROM idempotency_keys WHERE merchant_id = 'm' AND key = 'k7'`).Scan(&state); err != nil {
			t.Fatalf("reading during Migrate: %v; want no read blocked by a lock for %v", err, maxStall)
		}
		waits = append(waits, time.Since(t0))
	}
	<-rolledBack
	if rollback != nil {
		t.Fatal(rollback)
	}
	if merr != nil {
		t.Fatalf("Migrate: %v", merr)
	}
	worst := slices.Max(waits)
	t.Logf("Migrate took %v behind a transaction of %v; %d reads, the slowest %v",
		time.Since(began).Round(time.Millisecond), hold, len(waits), worst.Round(time.Microsecond))
}

// TestMigrateAfterV030 migrates a schema that release v0.3.0 left (0001 to
// 0004 applied as one transaction each, by the runner of that time): the
// new runner takes them as applied, applies 0005 only, and the schema is
// the one a fresh database gets.
func TestMigrateAfterV030(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	oldURL := pgtest.URL(t)
	conn, err := pgx.Connect(ctx, oldURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	schemaAt(t, conn, 4)
	if err := open(t, oldURL).Migrate(ctx); err != nil {
		t.Fatalf("Migrate after v0.3.0: %v", err)
	}
	freshURL := pgtest.URL(t)
	if err := open(t, freshURL).Migrate(ctx); err != nil {
		t.Fatalf("Migrate on an empty schema: %v", err)
	}
	fresh, err := pgx.Connect(ctx, freshURL)
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close(context.Background())
	upgraded, want := describeSchema(t, conn), describeSchema(t, fresh)
	t.Logf("%d schema objects compared", strings.Count(want, "\n")+1)
	if upgraded != want {
		t.Errorf("schema after v0.3.0 and Migrate:\n%s\n\nfresh schema:\n%s", upgraded, want)
	}
	applied := func(c *pgx.Conn) []int32 {
		rows, err := c.Query(ctx, `SELECT version FROM schema_migrations ORDER BY version`)
		var versions []int32
		if err == nil {
			versions, err = pgx.CollectRows(rows, pgx.RowTo[int32])
		}
		if err != nil {
			t.Fatal(err)
		}
		return versions
	}
	if got, want := applied(conn), applied(fresh); !slices.Equal(got, want) || len(got) < 5 {
		t.Errorf("schema_migrations after v0.3.0 and Migrate: %v; want a fresh schema's %v", got, want)
	}
}

// describeSchema lists the tables, columns, indexes, triggers, functions and
// storage options of conn's current schema, one per line, with the schema's
// name left out, so two schemas can be compared.
func describeSchema(t *testing.T, conn *pgx.Conn) string {
	t.Helper()
	rows, err := conn.Query(t.Context(), `
		SELECT 'column ' || table_name || '.' || column_name || ' ' || data_type || ' null=' || is_nullable || ' default=' || coalesce(column_default, '')
		FROM information_schema.columns WHERE table_schema = current_schema()
		UNION ALL
		SELECT 'index ' || indexdef FROM pg_indexes WHERE schemaname = current_schema()
		UNION ALL
		SELECT 'trigger ' || pg_get_triggerdef(tg.oid) FROM pg_trigger tg
		JOIN pg_class c ON c.oid = tg.tgrelid WHERE c.relnamespace = current_schema()::regnamespace AND NOT tg.tgisinternal
		UNION ALL
		SELECT 'function ' || p.proname || ' ' || md5(p.prosrc) FROM pg_proc p WHERE p.pronamespace = current_schema()::regnamespace
		UNION ALL
		SELECT 'table ' || relname || ' ' || relkind::text || ' ' || coalesce(array_to_string(reloptions, ','), '')
		FROM pg_class WHERE relnamespace = current_schema()::regnamespace AND relkind IN ('r', 'S')
		ORDER BY 1`)
	if err != nil {
		t.Fatalf("describing the schema: %v", err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatalf("describing the schema: %v", err)
	}
	var schema string
	if err := conn.QueryRow(t.Context(), `SELECT current_schema()`).Scan(&schema); err != nil {
		t.Fatal(err)
	}
	return strings.ReplaceAll(strings.Join(lines, "\n"), schema+".", "")
}

// TestMigrateWaitsForTheMigrationLock: an instance whose URL bounds lock
// waits (lock_timeout, statement_timeout: common settings) starts while
// another instance is migrating. Its Migrate waits for the migration lock
// and then finds the work done; the URL's timeouts are for the service's
// statements, not for taking turns at migrating (seen failing before:
// "taking the migration lock: ... canceling statement due to lock timeout
// (SQLSTATE 55P03)").
func TestMigrateWaitsForTheMigrationLock(t *testing.T) {
	t.Parallel()
	const (
		// migrateLockKey, the key every Migrate takes ("chargonc").
		migrateLockKey = 0x63686172676f6e63
		// The URL's timeouts are a second: short beside the other
		// instance's migration (hold), long beside any statement Open
		// sends on a loaded machine (100 ms timed Open's own connect
		// check out on a cold CI run).
		timeout = "1s"
		hold    = 2500 * time.Millisecond
	)
	ctx := t.Context()
	url := pgtest.URL(t)
	other, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(context.Background())
	for _, params := range []string{"&lock_timeout=" + timeout, "&statement_timeout=" + timeout} {
		if _, err := other.Exec(ctx, "SELECT pg_advisory_lock($1)", int64(migrateLockKey)); err != nil {
			t.Fatal(err)
		}
		store, err := postgres.Open(ctx, url+params)
		if err != nil {
			t.Fatal(err)
		}
		// other is released from here on, and waited for before anything
		// else may use or close it.
		released := make(chan error, 1)
		go func() {
			time.Sleep(hold)
			_, err := other.Exec(context.Background(), "SELECT pg_advisory_unlock($1)", int64(migrateLockKey))
			released <- err
		}()
		start := time.Now()
		migrated := store.Migrate(ctx)
		waited := time.Since(start)
		if err := <-released; err != nil {
			t.Fatal(err)
		}
		if migrated != nil {
			t.Errorf("%s: Migrate while another instance migrates: %v", params, migrated)
		} else if waited < hold/2 {
			t.Errorf("%s: Migrate returned after %v, before the other instance's migration ended (%v)", params, waited, hold)
		}
		// The migration's session gave the URL's timeout back.
		name, want, _ := strings.Cut(strings.TrimPrefix(params, "&"), "=")
		for _, c := range store.Pool().AcquireAllIdle(ctx) {
			var got string
			if err := c.QueryRow(ctx, "SHOW "+name).Scan(&got); err != nil {
				t.Fatal(err)
			}
			c.Release()
			if got != want {
				t.Errorf("%s after Migrate: %s on a pooled connection, want %s", name, got, want)
			}
		}
		store.Close()
	}
}
