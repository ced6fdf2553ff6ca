package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/postgres"
	"github.com/chargeonce/chargeonce/sqlite"
)

// adminTimeout bounds each administrative statement (creating or dropping
// the run's schema).
const adminTimeout = 30 * time.Second

// parentStore is this process's own store on the run's database: it seeds
// the replay keys and runs the raw-SQL way.
type parentStore struct {
	store chargeonce.Store
	core  core
	sim   *acquirer.Simulator
	// postmaster is the pid of the PostgreSQL server the run writes to,
	// when it runs on this machine (0 otherwise).
	postmaster int
}

func (p *parentStore) close() {
	p.store.Close()
	p.sim.Close()
}

// newDatabase creates a fresh schema (PostgreSQL) or claims a fresh file
// (SQLite) for the run, named with suffix, and returns its --db value.
func (b *bench) newDatabase(ctx context.Context, suffix string) (string, error) {
	if b.cfg.Pooler != "" {
		return b.newPooledDatabase(ctx, "chargeonce_bench_"+b.runID+suffix)
	}
	if b.postgres {
		schema := "chargeonce_bench_" + b.runID + suffix
		if err := b.execAdmin(ctx, "CREATE SCHEMA "+schema); err != nil {
			return "", fmt.Errorf("--db: creating schema %s: %w", schema, err)
		}
		b.schemas = append(b.schemas, schema)
		return withSearchPath(b.cfg.DB, schema)
	}
	path := strings.TrimPrefix(b.cfg.DB, "sqlite:")
	if suffix != "" {
		path += "." + strings.TrimPrefix(suffix, "_")
	}
	if _, err := os.Stat(path); err == nil {
		return "", fmt.Errorf("--db: %s exists; the benchmark creates its own database there and removes it afterwards, so name a path that does not exist", path)
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("--db: %w", err)
	}
	b.files = append(b.files, path)
	return "sqlite:" + path, nil
}

// dropDatabases drops the run's schemas or removes its files.
func (b *bench) dropDatabases() error {
	var errs []error
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	for _, s := range b.schemas {
		if err := b.execAdmin(ctx, "DROP SCHEMA IF EXISTS "+s+" CASCADE"); err != nil {
			errs = append(errs, fmt.Errorf("dropping schema %s: %w", s, err))
		}
	}
	b.schemas = nil
	for _, d := range b.dbs {
		// FORCE ends the pooler's server connections to it.
		if err := b.execAdmin(ctx, "DROP DATABASE IF EXISTS "+d+" WITH (FORCE)"); err != nil {
			errs = append(errs, fmt.Errorf("dropping database %s: %w", d, err))
		}
	}
	b.dbs = nil
	for _, f := range b.files {
		for _, p := range []string{f, f + "-wal", f + "-shm"} {
			if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	b.files = nil
	return errors.Join(errs...)
}

// newPooledDatabase creates the database name through --db, migrates it on
// a direct connection (migrations refuse a pooler: they hold a session lock
// and set lock_timeout per step) and returns its URL through --pooler.
func (b *bench) newPooledDatabase(ctx context.Context, name string) (string, error) {
	if err := b.execAdmin(ctx, "CREATE DATABASE "+name); err != nil {
		return "", fmt.Errorf("--db: creating database %s: %w", name, err)
	}
	b.dbs = append(b.dbs, name)
	direct, err := withDatabase(b.cfg.DB, name)
	if err != nil {
		return "", fmt.Errorf("--db: %w", err)
	}
	pooled, err := withDatabase(b.cfg.Pooler, name)
	if err != nil {
		return "", fmt.Errorf("--pooler: %w", err)
	}
	s, err := postgres.Open(ctx, direct)
	if err != nil {
		return "", fmt.Errorf("--db: %w", err)
	}
	defer s.Close()
	if err := s.Migrate(ctx); err != nil {
		return "", fmt.Errorf("--db: migrating %s: %w", name, err)
	}
	// A --pooler that reaches PostgreSQL directly would measure cached
	// statements, not what the flag promises.
	if err := checkPooled(ctx, pooled); err != nil {
		return "", err
	}
	return pooled, nil
}

// checkPooled opens url and fails unless it goes through a pooler.
func checkPooled(ctx context.Context, u string) error {
	s, err := postgres.Open(ctx, u)
	if err != nil {
		return fmt.Errorf("--pooler: %w", err)
	}
	defer s.Close()
	if !s.Pooled() {
		return fmt.Errorf("--pooler: %s reaches PostgreSQL directly, not through a pooler", redactURL(u))
	}
	return nil
}

// withDatabase returns base naming the database name instead of its own.
func withDatabase(base, name string) (string, error) {
	u, err := url.Parse(base)
	if err != nil {
		return "", fmt.Errorf("must be a postgres:// URL: %w", err)
	}
	u.Path = "/" + name
	u.RawPath = ""
	return u.String(), nil
}

// execAdmin runs one statement on a connection of its own to --db.
func (b *bench) execAdmin(ctx context.Context, sql string) error {
	ctx, cancel := context.WithTimeout(ctx, adminTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, b.cfg.DB)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, sql)
	return err
}

// withSearchPath returns base with its search_path set to schema, which
// pgx sends as a runtime parameter: every unqualified table the stores
// create or query lands in the schema.
func withSearchPath(base, schema string) (string, error) {
	u, err := url.Parse(base)
	if err != nil {
		return "", fmt.Errorf("--db must be a postgres:// URL: %w", err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// setup creates the run's database, starts the two servers, opens this
// process's store and seeds the replay keys.
func (b *bench) setup(ctx context.Context) error {
	db, err := b.newDatabase(ctx, "")
	if err != nil {
		return err
	}
	b.main = db
	b.logf("database %s", redactURL(db))
	// chargeonce first: it migrates the database the others then find.
	co, err := b.spawn(ctx, wayChargeonce, kindChargeonce, db)
	if err != nil {
		return err
	}
	bare, err := b.spawn(ctx, wayBare, kindBare, db)
	if err != nil {
		return err
	}
	minimal, err := b.spawn(ctx, wayMinimal, kindMinimal, db)
	if err != nil {
		return err
	}
	store, c, sim, err := openCore(ctx, db)
	if err != nil {
		return fmt.Errorf("--db: %w", err)
	}
	b.parent = &parentStore{store: store, core: c, sim: sim, postmaster: findPostmaster(ctx, store)}
	b.ways = []*way{
		{name: wayChargeonce, server: co, checksFlag: true, newClient: func() client { return newHTTPClient(co.addr, b.secret) }},
		{name: wayBare, server: bare, newClient: func() client { return newHTTPClient(bare.addr, b.secret) }},
		{name: wayRaw, newClient: func() client { return rawClient{c} }},
		{name: wayMinimal, server: minimal, noReplay: true, newClient: func() client { return newHTTPClient(minimal.addr, b.secret) }},
	}
	if b.cfg.Webhooks {
		if err := b.setupWebhooks(ctx, db); err != nil {
			return err
		}
	}
	if containsString(b.cfg.Workloads, WorkloadReplay) {
		return b.seedReplayKeys(ctx)
	}
	return nil
}

func containsString(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// seedReplayKeys charges ReplayKeys intents through chargeonce's engine
// (the same protocol `serve` runs, without HTTP), so that every one has a
// stored response for the replay workload.
func (b *bench) seedReplayKeys(ctx context.Context) error {
	start := time.Now()
	eng := engine.New(b.parent.store, b.parent.sim, engine.Options{})
	keys := make([]string, b.cfg.ReplayKeys)
	for i := range keys {
		keys[i] = "rp-" + b.runID + "-" + strconv.Itoa(i)
	}
	var (
		wg    sync.WaitGroup
		next  = make(chan string)
		errMu sync.Mutex
		first error
	)
	for range 16 {
		wg.Go(func() {
			for k := range next {
				req := *replayRequest()
				if err := req.Normalize(); err != nil {
					panic(err) // the benchmark's own request is valid
				}
				resp, err := eng.Charge(ctx, merchant, k, &req)
				if err == nil && resp.Status != http.StatusCreated {
					err = fmt.Errorf("status %d: %s", resp.Status, resp.Body)
				}
				if err != nil {
					errMu.Lock()
					if first == nil {
						first = fmt.Errorf("seeding replay key %s: %w", k, err)
					}
					errMu.Unlock()
				}
			}
		})
	}
	for _, k := range keys {
		if ctx.Err() != nil {
			break
		}
		next <- k
	}
	close(next)
	wg.Wait()
	if first != nil {
		return first
	}
	b.replayKeys = keys
	b.logf("seeded %d replay keys in %s", len(keys), time.Since(start).Round(time.Millisecond))
	return ctx.Err()
}

// check looks for what must never happen: a key with two charges, or a
// reference chargeonce sent the acquirer twice.
func (b *bench) check(ctx context.Context) error {
	const q = `SELECT count(*) FROM (SELECT 1 FROM charges GROUP BY merchant_id, idempotency_key HAVING count(*) > 1) d`
	var doubles, charges int64
	switch s := b.parent.store.(type) {
	case *postgres.Store:
		if err := s.Pool().QueryRow(ctx, q).Scan(&doubles); err != nil {
			return fmt.Errorf("checking for double charges: %w", err)
		}
		if err := s.Pool().QueryRow(ctx, `SELECT count(*) FROM charges`).Scan(&charges); err != nil {
			return fmt.Errorf("counting charges: %w", err)
		}
	case *sqlite.Store:
		_, rdb := s.DBs()
		if err := rdb.QueryRowContext(ctx, q).Scan(&doubles); err != nil {
			return fmt.Errorf("checking for double charges: %w", err)
		}
		if err := rdb.QueryRowContext(ctx, `SELECT count(*) FROM charges`).Scan(&charges); err != nil {
			return fmt.Errorf("counting charges: %w", err)
		}
	}
	b.checks = append(b.checks, fmt.Sprintf("%d charges in the database, %d keys with more than one charge", charges, doubles))
	if doubles != 0 {
		return fmt.Errorf("%d idempotency keys have more than one charge", doubles)
	}
	var st acquirer.Stats
	if err := getJSON(ctx, "http://"+b.ways[0].server.addr+"/acquirer/v1/stats", &st); err != nil {
		// The statistics are a check of their own, not a reason to fail the
		// run whose results are already in.
		b.checks = append(b.checks, "chargeonce's acquirer statistics: not available ("+err.Error()+")")
		return nil //nolint:nilerr // reported as a check line above
	}
	b.checks = append(b.checks, fmt.Sprintf("chargeonce's acquirer: %d capture requests, %d captures, %d duplicate requests", st.CaptureRequests, st.Captures, st.DuplicateRequests))
	if st.DuplicateRequests != 0 {
		return fmt.Errorf("chargeonce sent the acquirer %d duplicate capture requests", st.DuplicateRequests)
	}
	return nil
}

func getJSON(ctx context.Context, u string, dst any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	hc := &http.Client{Timeout: 10 * time.Second}
	defer hc.CloseIdleConnections()
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, resp.Body)
		return fmt.Errorf("GET %s: %s", u, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(dst)
}

// preloadedBody is the stored response of every preloaded key: a charge
// object of the usual size.
const preloadedBody = `{"id":"ch_0123456789abcdef01234567","order_id":1000000001,"amount_cents":2500,"currency":"BRL","status":"captured","decline_code":null,"created_at":"2026-01-01T00:00:00Z"}`

// preload puts n completed keys and their charges into the store's tables,
// in bulk, with keys shaped like the UUIDs clients send (32 hex digits), so
// that the index is as large and as scattered as a busy day leaves it.
//
// Preloaded charge ids have the shape of idempotency.NewChargeID's: the
// creation time in milliseconds (spread over the last day) and random hex.
func preload(ctx context.Context, store chargeonce.Store, n int) error {
	switch s := store.(type) {
	case *postgres.Store:
		p := s.Pool()
		if _, err := p.Exec(ctx, `
INSERT INTO charges (id, merchant_id, idempotency_key, order_id, amount_cents, currency, payment_token, description, status, created_at, updated_at)
SELECT `+preloadID+`, $1, md5(g::text), 1000000000 + g, 2500, 'BRL', 'tok_ok', '', 'captured', now(), now()
FROM generate_series(1, $2::int) g`, merchant, n); err != nil {
			return fmt.Errorf("preloading charges: %w", err)
		}
		if _, err := p.Exec(ctx, `
INSERT INTO idempotency_keys (merchant_id, key, fingerprint, token, state, lease_until, response_status, response_body, charge_id, created_at, updated_at, expires_at)
SELECT $1, md5(g::text), 'preloaded', md5(g::text || 't'), 'completed', now(), 201, $3::bytea,
	`+preloadID+`, now(), now(), now() + interval '24 hours'
FROM generate_series(1, $2::int) g`, merchant, n, []byte(preloadedBody)); err != nil {
			return fmt.Errorf("preloading idempotency keys: %w", err)
		}
		return analyze(ctx, store)
	case *sqlite.Store:
		wdb, _ := s.DBs()
		const now = `(CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER) * 1000)`
		if _, err := wdb.ExecContext(ctx, `
WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < ?1)
INSERT OR IGNORE INTO idempotency_keys
	(merchant_id, key, fingerprint, token, state, lease_until, recovery_attempts, response_status, response_body,
	 charge_id, created_at, updated_at, expires_at)
SELECT ?2, lower(hex(randomblob(16))), 'preloaded', lower(hex(randomblob(16))), 'completed', `+now+`, 0, 201, ?3,
	'ch_' || substr(printf('%012x', CAST(unixepoch('subsec') * 1000 AS INTEGER) - 86400000 + n * (86400000 / ?1)), 1, 12) || lower(hex(randomblob(8))),
	`+now+`, `+now+`, `+now+` + 86400000000
FROM g`, n, merchant, []byte(preloadedBody)); err != nil {
			return fmt.Errorf("preloading idempotency keys: %w", err)
		}
		if _, err := wdb.ExecContext(ctx, `
INSERT OR IGNORE INTO charges (id, merchant_id, idempotency_key, order_id, amount_cents, currency, payment_token, description, status, decline_code, created_at, updated_at)
SELECT charge_id, merchant_id, key, 1000000000 + rowid, 2500, 'BRL', 'tok_ok', '', 'captured', NULL, created_at, created_at
FROM idempotency_keys WHERE fingerprint = 'preloaded'`); err != nil {
			return fmt.Errorf("preloading charges: %w", err)
		}
		return nil
	}
	return fmt.Errorf("preloading: unknown store %T", store)
}

// analyze vacuums and analyzes the tables (PostgreSQL), so that neither
// table is measured while autovacuum or hint-bit writes catch up with a
// bulk load.
func analyze(ctx context.Context, store chargeonce.Store) error {
	s, ok := store.(*postgres.Store)
	if !ok {
		return nil
	}
	for _, t := range []string{"idempotency_keys", "charges"} {
		if _, err := s.Pool().Exec(ctx, "VACUUM (ANALYZE) "+t); err != nil {
			return fmt.Errorf("vacuuming %s: %w", t, err)
		}
	}
	return nil
}

// preloadID is the SQL for the g-th preloaded charge id: like
// idempotency.NewChargeID, 12 hex digits of a millisecond timestamp (the
// last 24 hours, in order) and 16 of random-looking hex.
const preloadID = `'ch_' || lpad(to_hex((extract(epoch from now()) * 1000)::bigint - 86400000 + g * (86400000 / $2::int)), 12, '0') || substr(md5(g::text || 'c'), 1, 16)`
