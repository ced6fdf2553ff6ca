package postgres_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/internal/pgtest"
	"github.com/chargeonce/chargeonce/postgres"
)

// scans is what pg_stat_user_tables says of the store's two tables.
type scans struct{ seq, idx, read, blocks int64 }

func tableScans(t *testing.T, conn *pgx.Conn, schema string) scans {
	t.Helper()
	var s scans
	err := conn.QueryRow(t.Context(), `
		SELECT coalesce(sum(seq_scan), 0), coalesce(sum(idx_scan), 0),
			coalesce(sum(seq_tup_read), 0) + coalesce(sum(idx_tup_fetch), 0),
			(SELECT coalesce(sum(idx_blks_hit + idx_blks_read), 0) FROM pg_statio_user_tables
				WHERE schemaname = $1 AND relname IN ('idempotency_keys', 'charges'))
		FROM pg_stat_user_tables
		WHERE schemaname = $1 AND relname IN ('idempotency_keys', 'charges')`, schema).Scan(&s.seq, &s.idx, &s.read, &s.blocks)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// flushStats makes every connection of s publish its table statistics
// now; an idle backend otherwise holds them for up to ten seconds.
func flushStats(t *testing.T, s *postgres.Store) {
	t.Helper()
	conns := s.Pool().AcquireAllIdle(t.Context())
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	for _, c := range conns {
		// PostgreSQL 15 or later: the test server must be one.
		if _, err := c.Exec(t.Context(), "SELECT pg_stat_force_next_flush()"); err != nil {
			t.Fatal(err)
		}
	}
}

// migratedWithoutAutovacuum migrates connURL's schema and turns autovacuum
// off on tables, so that their statistics stay those of the small tables
// the store's plans are made on; it returns the store that migrated (the
// caller closes it) and the schema.
func migratedWithoutAutovacuum(t *testing.T, connURL string, tables ...string) (*postgres.Store, string) {
	t.Helper()
	ctx := t.Context()
	setup := open(t, connURL)
	if err := setup.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	var schema string
	if err := setup.Pool().QueryRow(ctx, "SELECT current_schema()").Scan(&schema); err != nil {
		t.Fatal(err)
	}
	for _, table := range tables {
		if _, err := setup.Pool().Exec(ctx, "ALTER TABLE "+table+" SET (autovacuum_enabled = false)"); err != nil {
			t.Fatal(err)
		}
	}
	return setup, schema
}

// TestPlansMadeOnEmptyTablesUseIndexesAsTheyGrow pins the stale generic
// plan: the store's statements first run on a new deployment's empty
// tables, which then grow with no ANALYZE (autovacuum off here, as it is
// for a while in the field), half of the records in flight (an acquirer
// outage), and must still find their rows through an index. A named
// prepared statement switches to a generic plan after five runs, and a
// generic plan made on empty tables scans them whole, or walks a whole
// partial index, for as long as it is cached. Behind a pooler the store
// sends its statements unnamed (chosen by Open:
// TestOpenChoosesExecModeByPooler), so each is planned with the tables as
// they are, with no session setting (a pooler refuses them); on a
// connection of its own it keeps named statements for their speed, with
// sequential scans off (docs/pooler.md). Both modes are measured, and the
// named one with and without batches (a batch of one runs each statement
// alone). Seen failing on the store's statements, each fixed as params.go
// says: with the completion batch's state a constant, the named mode read
// 4,850 rows a charge, 108 ms a batch; unbatched, the single completion and
// its siblings (a lease's renewal, a claim, a release) read 47,000-71,000;
// a release's charge DELETE, joined to its record with the status a
// constant, walked charges_merchant_order_status_created_idx (89 ms); and
// ChargeGet, with merchant_id = $1 AND id = $2, walked the merchant's
// history through an index led by merchant_id (600-1,730 index blocks a
// charge). The grown rows are the test merchant's own: its history is what
// such a plan walks.
func TestPlansMadeOnEmptyTablesUseIndexesAsTheyGrow(t *testing.T) {
	t.Parallel()
	for _, mode := range []struct {
		name, url string
		opts      []postgres.Option
	}{
		{"unnamed", "&default_query_exec_mode=exec", nil},
		{"named", "", nil},
		// Each attempt's statements alone: a batch of one runs them too.
		{"named/unbatched", "", []postgres.Option{postgres.WithoutBatching()}},
	} {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			plansAsTablesGrow(t, mode.url, mode.opts...)
		})
	}
}

func plansAsTablesGrow(t *testing.T, urlSuffix string, opts ...postgres.Option) {
	connURL := pgtest.URL(t)
	ctx := t.Context()
	setup, schema := migratedWithoutAutovacuum(t, connURL, "idempotency_keys", "charges")
	setup.Close()

	// Two connections, so that every statement runs many times on each.
	s, err := postgres.Open(ctx, connURL+urlSuffix, append(opts, postgres.WithMaxConns(2))...)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const goroutines, perGoroutine = 32, 10
	const charges = goroutines * perGoroutine
	round := func(prefix string) {
		var wg sync.WaitGroup
		for g := range goroutines {
			wg.Go(func() {
				for i := range perGoroutine {
					key := fmt.Sprintf("%s-%d-%d", prefix, g, i)
					p := chargeonce.KeyInsertParams{
						Fingerprint: "fp", Token: "tok_" + key, Lease: time.Minute,
						Charge: chargeonce.Charge{ID: "ch_" + key, MerchantID: "m", IdempotencyKey: key, OrderID: int64(i), AmountCents: 1, Currency: "BRL", PaymentToken: "tok_ok"},
					}
					if _, inserted, err := s.KeyInsert(ctx, p); err != nil || !inserted {
						t.Errorf("KeyInsert: inserted=%v err=%v", inserted, err)
						return
					}
					// Every statement that names a processing record by
					// its key: an attempt's, recovery's, the queue's.
					if err := s.KeyAcquirerIDSet(ctx, "m", key, p.Token, "acq_"+key); err != nil {
						t.Errorf("KeyAcquirerIDSet: %v", err)
						return
					}
					if err := s.KeyLeaseSet(ctx, "m", key, p.Token, 0, true); err != nil {
						t.Errorf("KeyLeaseSet: %v", err)
						return
					}
					token := "tok2_" + key
					if _, claimed, err := s.KeyClaim(ctx, "m", key, token, time.Minute); err != nil || !claimed {
						t.Errorf("KeyClaim: claimed=%v err=%v", claimed, err)
						return
					}
					if flagged, err := s.KeyNotify(ctx, "m", key); err != nil || !flagged {
						t.Errorf("KeyNotify: flagged=%v err=%v", flagged, err)
						return
					}
					released := p
					released.Charge.ID, released.Charge.IdempotencyKey, released.Token = "ch_r"+key, "r"+key, "tok_r"+key
					if _, inserted, err := s.KeyInsert(ctx, released); err != nil || !inserted {
						t.Errorf("KeyInsert: inserted=%v err=%v", inserted, err)
						return
					}
					if err := s.KeyRelease(ctx, "m", "r"+key, released.Token); err != nil {
						t.Errorf("KeyRelease: %v", err)
						return
					}
					if err := s.KeyComplete(ctx, chargeonce.KeyCompleteParams{
						MerchantID: "m", Key: key, Token: token, ResponseStatus: 201, ResponseBody: []byte("{}"),
						ChargeStatus: chargeonce.StatusCaptured, TTL: time.Hour,
					}); err != nil {
						t.Errorf("KeyComplete: %v", err)
						return
					}
					if _, err := s.KeyGet(ctx, "m", key); err != nil {
						t.Errorf("KeyGet: %v", err)
					}
					if _, err := s.ChargeGet(ctx, "m", p.Charge.ID); err != nil {
						t.Errorf("ChargeGet: %v", err)
					}
				}
			})
		}
		wg.Wait()
	}
	round("empty") // plans are made here, on (nearly) empty tables

	admin, err := pgx.Connect(ctx, connURL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	const grown = 100_000
	if _, err := admin.Exec(ctx, `
		WITH k AS (
			INSERT INTO idempotency_keys (merchant_id, key, fingerprint, token, state, lease_until, charge_id, expires_at)
			SELECT 'm', 'k' || i, 'fp', 'tok', CASE WHEN i % 2 = 0 THEN 'processing' ELSE 'completed' END,
				now() + interval '1 hour', 'bulk_' || i, CASE WHEN i % 2 = 1 THEN now() + interval '1 day' END
			FROM generate_series(1, $1::int) i
			RETURNING charge_id
		)
		INSERT INTO charges (id, merchant_id, idempotency_key, order_id, amount_cents, currency, payment_token, status)
		SELECT charge_id, 'm', charge_id, 1, 1, 'BRL', 'tok', 'captured' FROM k`, grown); err != nil {
		t.Fatal(err)
	}

	flushStats(t, s)
	before := tableScans(t, admin, schema)
	start := time.Now()
	round("grown")
	elapsed := time.Since(start)
	flushStats(t, s)
	after := tableScans(t, admin, schema)
	perCharge := float64(after.read-before.read) / charges
	blocksPerCharge := float64(after.blocks-before.blocks) / charges
	t.Logf("after growing to %d rows: %d charges in %v, %d sequential scans, %d index scans, %.1f rows read a charge, %.1f index blocks",
		grown, charges, elapsed, after.seq-before.seq, after.idx-before.idx, perCharge, blocksPerCharge)
	// A charge's statements read its record and its charge, a few times
	// over, each through a few index blocks (103-111 blocks a charge in
	// all, for 15 statements); a stale plan reads a table, or a whole
	// index, for each, or walks an index led by merchant_id through the
	// merchant's whole history, which counts blocks, not rows
	// (ChargeGet: 600-1,730 blocks a charge).
	if after.seq != before.seq || perCharge > 50 || blocksPerCharge > 250 {
		t.Fatalf("after the tables grew to %d rows the store's statements made %d sequential scans and read %.0f rows and %.0f index blocks a charge (plans made on empty tables); want index lookups of a few rows",
			grown, after.seq-before.seq, perCharge, blocksPerCharge)
	}
}

// TestRefundsAndCapturesReadTheirChargeByID pins the plans of a refund's
// and a capture's insert: each reads the one charge it names, whatever
// else its merchant has. With the merchant, the status and the id in one
// WHERE, PostgreSQL may pick charges_merchant_status_created_idx (merchant,
// status, created_at, id) over the primary key when it has no statistics
// (sequential scans are off on the store's own connections: docs/pooler.md)
// and then walk every captured, or authorized, charge of the merchant for
// each refund or capture: a cost that grows with the merchant's history.
func TestRefundsAndCapturesReadTheirChargeByID(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	connURL := pgtest.URL(t)
	setup, schema := migratedWithoutAutovacuum(t, connURL, "charges")
	// The merchant's history: captured (even) and authorized (odd) charges.
	history := func(from, to int) {
		t.Helper()
		if _, err := setup.Pool().Exec(ctx, `
			INSERT INTO charges (id, merchant_id, idempotency_key, order_id, amount_cents, currency, payment_token, status, capture_method)
			SELECT 'ch_old_' || i, 'm', 'old-' || i, i, 1000, 'BRL', 'tok',
				CASE WHEN i % 2 = 0 THEN 'captured' ELSE 'authorized' END,
				CASE WHEN i % 2 = 1 THEN 'manual' END
			FROM generate_series($1::int, $2::int) i`, from, to); err != nil {
			t.Fatal(err)
		}
	}
	// Two connections, so that every statement runs many times on each and
	// is planned, then cached as a generic plan, on the small tables.
	s, err := postgres.Open(ctx, connURL, postgres.WithMaxConns(2))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const small, grown, n = 400, 40_000, 40
	round := func(prefix string) {
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				key := fmt.Sprintf("%s-refund-%d", prefix, i)
				_, inserted, err := s.RefundInsert(ctx, chargeonce.RefundInsertParams{
					Fingerprint: "fp", Token: "tok_" + key, Lease: time.Minute,
					Refund: chargeonce.Refund{ID: "re_" + key, MerchantID: "m", IdempotencyKey: key,
						ChargeID: fmt.Sprintf("ch_old_%d", 2*(i+1)), AmountCents: 10},
				})
				if err != nil || !inserted {
					t.Errorf("RefundInsert %s: inserted=%v err=%v", key, inserted, err)
				}
			})
			wg.Go(func() {
				key := fmt.Sprintf("%s-capture-%d", prefix, i)
				_, inserted, err := s.OperationInsert(ctx, chargeonce.OperationInsertParams{
					Fingerprint: "fp", Token: "tok_" + key, Lease: time.Minute,
					Operation: chargeonce.Operation{ID: "cp_" + key, Kind: chargeonce.KindCapture, MerchantID: "m",
						IdempotencyKey: key, ChargeID: fmt.Sprintf("ch_old_%s_%d", prefix, 2*i+1), AmountCents: 10},
				})
				if err != nil || !inserted {
					t.Errorf("OperationInsert %s: inserted=%v err=%v", key, inserted, err)
					return
				}
				if err := s.KeyComplete(ctx, chargeonce.KeyCompleteParams{
					Kind: chargeonce.KindCapture, MerchantID: "m", Key: key, Token: "tok_" + key,
					OperationStatus: chargeonce.OperationSucceeded, ResponseStatus: 200, ResponseBody: []byte("{}"), TTL: time.Hour,
				}); err != nil {
					t.Errorf("completing capture %s: %v", key, err)
				}
			})
		}
		wg.Wait()
	}
	// Each round captures authorizations of its own (one capture each).
	authorizations := func(prefix string) {
		t.Helper()
		if _, err := setup.Pool().Exec(ctx, `
			INSERT INTO charges (id, merchant_id, idempotency_key, order_id, amount_cents, currency, payment_token, status, capture_method)
			SELECT 'ch_old_' || $1 || '_' || i, 'm', 'auth-' || $1 || '-' || i, i, 1000, 'BRL', 'tok', 'authorized', 'manual'
			FROM generate_series(1, $2::int) i WHERE i % 2 = 1`, prefix, 2*n); err != nil {
			t.Fatal(err)
		}
	}
	history(1, small)
	authorizations("small")
	round("small") // plans are made here, on small tables
	history(small+1, grown)
	authorizations("grown")

	admin, err := pgx.Connect(ctx, connURL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	flushStats(t, s)
	before := chargeReads(t, admin, schema)
	round("grown")
	flushStats(t, s)
	after := chargeReads(t, admin, schema)
	perInsert := float64(after.read-before.read) / (2 * n)
	t.Logf("with %d charges of the merchant: %.1f charges read a refund, or a capture and its completion, %d sequential scans", grown, perInsert, after.seq-before.seq)
	if after.seq != before.seq || perInsert > 20 {
		t.Fatalf("a refund, or a capture and its completion, read %.0f charges (%d sequential scans) with %d charges of its merchant stored; want its charge by id, a few rows",
			perInsert, after.seq-before.seq, grown)
	}
}

// chargeReads is what pg_stat_user_tables says of the charges table.
func chargeReads(t *testing.T, conn *pgx.Conn, schema string) scans {
	t.Helper()
	var s scans
	if err := conn.QueryRow(t.Context(), `
		SELECT coalesce(seq_scan, 0), coalesce(idx_scan, 0), coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0)
		FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = 'charges'`, schema).Scan(&s.seq, &s.idx, &s.read); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestReadsByIDUseThePrimaryKeyAsTablesGrow pins the by-id reads of
// refunds and events (params.go, "byID"): a refund, an event, and the
// cursor row of a page of either are read by id alone, the owner compared
// afterwards. With merchant_id = $1 AND id = $2, a generic plan made on
// small tables may walk an index led by merchant_id (refunds_merchant_created,
// webhook_events_merchant_created) through the merchant's whole history, as
// ChargeGet did (TestPlansMadeOnEmptyTablesUseIndexesAsTheyGrow); a page
// written as one statement for every filter ("empty OR condition") may read the
// whole table through its primary key and sort it. Seen failing, 100,000
// of each stored: RefundGet 594 index blocks a read and RefundsList 597
// (merchant_id = $1 AND id = $2); WebhookEventsList 2,143, and 2,140 for
// one charge's events, after the by-id change (keyset.Where fixed them).
func TestReadsByIDUseThePrimaryKeyAsTablesGrow(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	connURL := pgtest.URL(t)
	setup, schema := migratedWithoutAutovacuum(t, connURL, "refunds", "webhook_events", "webhook_attempts")
	// The merchant's refunds and events, from..to, each one second older
	// than the one before it: the refunds all of one captured charge, the
	// events each of a charge of its own (its settlement).
	history := func(from, to int) {
		t.Helper()
		if _, err := setup.Pool().Exec(ctx, `
			WITH r AS (
				INSERT INTO refunds (id, merchant_id, idempotency_key, charge_id, amount_cents, currency, status, created_at)
				SELECT 're_' || i, 'm', 'rk-' || i, 'ch_m', 1, 'BRL', 'succeeded', now() - i * interval '1 second'
				FROM generate_series($1::int, $2::int) i
			)
			INSERT INTO webhook_events (id, merchant_id, charge_id, type, created_at)
			SELECT 'evt_' || i, 'm', 'ch_' || i, 'charge.captured', now() - i * interval '1 second'
			FROM generate_series($1::int, $2::int) i`, from, to); err != nil {
			t.Fatal(err)
		}
		// Five attempts of each event: an endpoint that failed four times.
		if _, err := setup.Pool().Exec(ctx, `
			INSERT INTO webhook_attempts (event_id, endpoint_id, status_code, latency_us)
			SELECT 'evt_' || i, 'we_m', 500, 1000 FROM generate_series($1::int, $2::int) i, generate_series(1, 5)`, from, to); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := setup.Pool().Exec(ctx, `
		INSERT INTO charges (id, merchant_id, idempotency_key, order_id, amount_cents, currency, payment_token, status)
		VALUES ('ch_m', 'm', 'k', 1, 1000000, 'BRL', 'tok', 'captured')`); err != nil {
		t.Fatal(err)
	}
	const small, grown, n = 40, 100_000, 20
	history(1, small)

	// Two connections, so that every statement runs many times on each and
	// is planned, then cached as a generic plan, on the small tables.
	s, err := postgres.Open(ctx, connURL, postgres.WithMaxConns(2))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	reads := []struct {
		name string
		read func(id string) error
	}{
		{"RefundGet", func(id string) error { _, err := s.RefundGet(ctx, "m", "re_"+id); return err }},
		{"RefundsList", func(id string) error {
			_, err := s.RefundsList(ctx, chargeonce.RefundsListParams{MerchantID: "m", Limit: 10, StartingAfter: "re_" + id})
			return err
		}},
		{"WebhookEventGet", func(id string) error { _, _, err := s.WebhookEventGet(ctx, "m", "evt_"+id); return err }},
		{"WebhookEventsList", func(id string) error {
			_, err := s.WebhookEventsList(ctx, chargeonce.EventsListParams{MerchantID: "m", Limit: 10, StartingAfter: "evt_" + id})
			return err
		}},
		{"WebhookAttemptsList", func(id string) error {
			page, err := s.WebhookAttemptsList(ctx, chargeonce.AttemptsListParams{MerchantID: "m", EventID: "evt_" + id, Limit: 2})
			if err == nil && page.HasMore {
				_, err = s.WebhookAttemptsList(ctx, chargeonce.AttemptsListParams{MerchantID: "m", EventID: "evt_" + id, Limit: 2,
					StartingAfter: page.Attempts[len(page.Attempts)-1].ID})
			}
			return err
		}},
		{"RefundsList of a charge", func(id string) error {
			_, err := s.RefundsList(ctx, chargeonce.RefundsListParams{MerchantID: "m", ChargeID: "ch_m", Limit: 10, StartingAfter: "re_" + id})
			return err
		}},
		{"WebhookEventsList of a charge", func(id string) error {
			_, err := s.WebhookEventsList(ctx, chargeonce.EventsListParams{MerchantID: "m", ChargeID: "ch_" + id, Limit: 10})
			return err
		}},
	}
	// round reads the oldest n of the small tables' refunds and events
	// (their pages hold a few rows) with each read of only.
	round := func(only string) {
		t.Helper()
		var wg sync.WaitGroup
		for i := 1; i <= n; i++ {
			for _, r := range reads {
				if only != "" && r.name != only {
					continue
				}
				wg.Go(func() {
					if err := r.read(fmt.Sprint(small - n + i)); err != nil {
						t.Errorf("%s: %v", r.name, err)
					}
				})
			}
		}
		wg.Wait()
	}
	for range 5 {
		round("") // plans are made here, on small tables
	}
	history(small+1, grown)

	admin, err := pgx.Connect(ctx, connURL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	blocks := func() int64 {
		t.Helper()
		flushStats(t, s)
		var b int64
		if err := admin.QueryRow(ctx, `
			SELECT coalesce(sum(idx_blks_hit + idx_blks_read), 0) FROM pg_statio_user_tables
			WHERE schemaname = $1 AND relname IN ('refunds', 'webhook_events', 'webhook_attempts')`, schema).Scan(&b); err != nil {
			t.Fatal(err)
		}
		return b
	}
	for _, r := range reads {
		before := blocks()
		round(r.name)
		perRead := float64(blocks()-before) / n
		t.Logf("%s with %d refunds and %d events of the merchant: %.1f index blocks a read", r.name, grown, grown, perRead)
		// A read by the primary key, or a page of ten from its cursor, is
		// a few index blocks; walking the merchant's history is hundreds.
		if perRead > 20 {
			t.Errorf("%s took %.0f index blocks a read with %d refunds and events stored; want a few (by id, then the owner compared)", r.name, perRead, grown)
		}
	}
}
