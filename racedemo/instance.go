package racedemo

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx", for the naive strategies
	_ "modernc.org/sqlite"             // database/sql driver "sqlite", for the naive strategies

	"github.com/chargeonce/chargeonce"
	"github.com/chargeonce/chargeonce/acquirer"
	"github.com/chargeonce/chargeonce/engine"
	"github.com/chargeonce/chargeonce/idempotency"
	"github.com/chargeonce/chargeonce/postgres"
	"github.com/chargeonce/chargeonce/sqlite"
)

// dialect is the kind of database a run uses.
type dialect int

const (
	dialectPostgres dialect = iota
	dialectSQLite
)

func (d dialect) String() string {
	if d == dialectSQLite {
		return "SQLite"
	}
	return "PostgreSQL"
}

// target is a parsed --db value.
type target struct {
	dialect dialect
	dsn     string // a postgres:// URL, or an SQLite file path
}

func parseDB(db string) (target, error) {
	switch {
	case strings.HasPrefix(db, "postgres://"), strings.HasPrefix(db, "postgresql://"):
		return target{dialectPostgres, db}, nil
	case strings.HasPrefix(db, "sqlite:"):
		path := strings.TrimPrefix(db, "sqlite:")
		if path == "" || strings.ContainsAny(path, "?#") || strings.Contains(path, ":memory:") {
			return target{}, fmt.Errorf("racedemo: sqlite: needs a plain file path, as in sqlite:chargeonce.db")
		}
		return target{dialectSQLite, path}, nil
	default:
		return target{}, fmt.Errorf("racedemo: the database must be postgres://… or sqlite:PATH")
	}
}

// SQLiteBusyTimeout is how long a naive strategy's SQLite connection waits
// for the write lock. It is long on purpose: under LockedTransaction every
// transaction holds SQLite's only write lock across an acquirer call, so
// attempts queue for about intents x latency, and the demonstration should
// show that queue rather than fail inside it.
const SQLiteBusyTimeout = 30 * time.Second

// The naive strategies' schema, valid in PostgreSQL and SQLite alike.
//
// race_naive_charges deliberately has no UNIQUE (merchant_id, order_id):
// CheckThenAct relies on its SELECT alone to find an existing charge.
// race_locked_charges has the UNIQUE key LockedTransaction inserts on.
var naiveSchema = []string{
	`CREATE TABLE IF NOT EXISTS race_naive_charges (
		id           TEXT PRIMARY KEY,
		merchant_id  TEXT NOT NULL,
		order_id     BIGINT NOT NULL,
		amount_cents BIGINT NOT NULL,
		status       TEXT NOT NULL
	)`,
	`CREATE INDEX IF NOT EXISTS race_naive_charges_order ON race_naive_charges (merchant_id, order_id)`,
	`CREATE TABLE IF NOT EXISTS race_locked_charges (
		merchant_id     TEXT NOT NULL,
		idempotency_key TEXT NOT NULL,
		id              TEXT NOT NULL,
		order_id        BIGINT NOT NULL,
		amount_cents    BIGINT NOT NULL,
		status          TEXT NOT NULL,
		response_status INTEGER,
		PRIMARY KEY (merchant_id, idempotency_key)
	)`,
}

// instance is one chargeonce instance of the workload: its own connection
// pool, and for InsertFirst its own store and engine.
type instance struct {
	opts    Options
	dialect dialect
	acq     chargeonce.Acquirer
	// db serves the naive strategies.
	db *sql.DB
	// store and engine serve InsertFirst.
	store  chargeonce.Store
	engine *engine.Engine
}

// openInstances opens o.Instances instances on t, prepares the strategy's
// schema through the first, and opens enough connections in each pool that
// connecting does not show up in the timings.
func openInstances(ctx context.Context, t target, o Options, sim *acquirer.Simulator, acqTimeout time.Duration) ([]*instance, error) {
	perInstance := (o.Intents*o.Attempts + o.Instances - 1) / o.Instances
	n := min(o.PoolSize, perInstance)
	insts := make([]*instance, o.Instances)
	errs := make([]error, o.Instances)
	open := func(m int) {
		in := &instance{opts: o, dialect: t.dialect, acq: recordingAcquirer{sim}}
		insts[m] = in
		var err error
		if o.Strategy == InsertFirst {
			err = in.openStore(ctx, t, m == 0, acqTimeout)
		} else {
			err = in.openNaive(ctx, t, m == 0)
		}
		if err == nil {
			err = in.warm(ctx, n)
		}
		if err != nil {
			errs[m] = fmt.Errorf("opening instance %s: %w", instanceName(m), err)
		}
	}
	// The first instance creates the schema; the others open (connecting
	// is most of the setup) all at once.
	open(0)
	if errs[0] == nil {
		var wg sync.WaitGroup
		for m := 1; m < o.Instances; m++ {
			wg.Go(func() { open(m) })
		}
		wg.Wait()
	}
	if err := errors.Join(errs...); err != nil {
		closeInstances(insts)
		return nil, err
	}
	return insts, nil
}

// openStore opens chargeonce's real store, with a pool of its own, and an
// engine over it: what `serve` runs, unchanged.
func (in *instance) openStore(ctx context.Context, t target, migrate bool, acqTimeout time.Duration) error {
	var err error
	switch t.dialect {
	case dialectPostgres:
		in.store, err = postgres.Open(ctx, t.dsn, postgres.WithMaxConns(in.opts.PoolSize))
	case dialectSQLite:
		in.store, err = sqlite.Open(ctx, t.dsn)
	}
	if err != nil {
		return err
	}
	if migrate {
		if err := in.store.Migrate(ctx); err != nil {
			return fmt.Errorf("migrating chargeonce's schema: %w", err)
		}
	}
	in.engine = engine.New(recordingStore{in.store}, in.acq, engine.Options{AcquirerTimeout: acqTimeout})
	return nil
}

// openNaive opens a database/sql pool for the naive strategies and, through
// the first instance, creates their tables.
func (in *instance) openNaive(ctx context.Context, t target, migrate bool) error {
	var err error
	switch t.dialect {
	case dialectPostgres:
		in.db, err = sql.Open("pgx", t.dsn)
	case dialectSQLite:
		q := url.Values{}
		q.Add("_pragma", fmt.Sprintf("busy_timeout(%d)", SQLiteBusyTimeout.Milliseconds()))
		q.Add("_pragma", "journal_mode(WAL)")
		q.Add("_pragma", "synchronous(NORMAL)")
		// BEGIN IMMEDIATE: a transaction takes the write lock when it
		// begins, never upgrades a read lock (which SQLite refuses with
		// SQLITE_BUSY instead of waiting).
		q.Set("_txlock", "immediate")
		in.db, err = sql.Open("sqlite", t.dsn+"?"+q.Encode())
	}
	if err != nil {
		return err
	}
	in.db.SetMaxOpenConns(in.opts.PoolSize)
	in.db.SetMaxIdleConns(in.opts.PoolSize)
	if err := in.db.PingContext(ctx); err != nil {
		return err
	}
	if migrate {
		for _, stmt := range naiveSchema {
			if _, err := in.db.ExecContext(ctx, stmt); err != nil {
				return fmt.Errorf("creating the demonstration's tables: %w", err)
			}
		}
	}
	return nil
}

// warm opens n connections in the instance's pool and returns them idle;
// for InsertFirst it also prepares the insert on them (warmKeyInsert).
func (in *instance) warm(ctx context.Context, n int) error {
	if in.db != nil {
		// Each goroutine keeps its connection until all are done, so the
		// n connections are distinct.
		conns := make([]*sql.Conn, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := 0; i < n; i++ {
			wg.Go(func() {
				c, err := in.db.Conn(ctx)
				if err != nil {
					errs[i] = fmt.Errorf("connecting: %w", err)
					return
				}
				conns[i] = c
				if err := in.warmNaive(ctx, c); err != nil {
					errs[i] = fmt.Errorf("warming up: %w", err)
				}
			})
		}
		wg.Wait()
		for _, c := range conns {
			if c != nil {
				_ = c.Close()
			}
		}
		return errors.Join(errs...)
	}
	if pg, ok := in.store.(*postgres.Store); ok {
		if err := warmPool(ctx, pg.Pool(), n); err != nil {
			return err
		}
	}
	return in.warmKeyInsert(ctx, n)
}

// warmPool opens n connections in pool, all at once, and releases them.
func warmPool(ctx context.Context, pool *pgxpool.Pool, n int) error {
	held := make([]*pgxpool.Conn, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Go(func() { held[i], errs[i] = pool.Acquire(ctx) })
	}
	wg.Wait()
	for _, c := range held {
		if c != nil {
			c.Release()
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("connecting: %w", err)
	}
	return nil
}

// warmNaive runs the strategy's statements once on conn, in a transaction
// it rolls back, so that the connection has prepared them (pgx caches
// prepared statements per connection) before the workload starts: the
// first attempts would otherwise measure PostgreSQL parsing SQL. The same
// is done for insert-first, so no strategy starts cold.
func (in *instance) warmNaive(ctx context.Context, conn *sql.Conn) error {
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	const merchant, key, id, order = "race-warmup", "warmup", "ch_warmup", 1
	switch in.opts.Strategy {
	case CheckThenAct:
		var got, status string
		if err := tx.QueryRowContext(ctx, sqlNaiveCheck, merchant, order).Scan(&got, &status); err != nil && !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		if _, err := tx.ExecContext(ctx, sqlNaiveInsert, id, merchant, order, DefaultAmountCents, "processing"); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, sqlNaiveComplete, "captured", id); err != nil {
			return err
		}
	case LockedTransaction:
		var got string
		if err := tx.QueryRowContext(ctx, sqlLockedInsert, merchant, key, id, order, DefaultAmountCents, "processing").Scan(&got); err != nil {
			return err
		}
		var status string
		var resp sql.NullInt64
		if err := tx.QueryRowContext(ctx, sqlLockedGet, merchant, key).Scan(&status, &resp); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, sqlLockedComplete, "captured", 201, merchant, key); err != nil {
			return err
		}
	}
	return nil
}

// warmKeyInsert runs n concurrent inserts of throwaway records and releases
// them (which deletes the record and its charge), so that every connection
// has prepared the insert statement before the workload starts. Without
// it, the first retries' waits would measure PostgreSQL parsing a
// statement, not the protocol.
func (in *instance) warmKeyInsert(ctx context.Context, n int) error {
	merchant := "race-warmup-" + randomHex(6)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Go(func() {
			key, token := fmt.Sprintf("warmup-%d", i), idempotency.NewToken()
			p := chargeonce.KeyInsertParams{
				Fingerprint: "warmup",
				Token:       token,
				Lease:       time.Minute,
				Charge: chargeonce.Charge{
					ID:             idempotency.NewChargeID(),
					MerchantID:     merchant,
					IdempotencyKey: key,
					OrderID:        int64(i + 1),
					AmountCents:    DefaultAmountCents,
					Currency:       chargeonce.DefaultCurrency,
					PaymentToken:   "tok_ok",
				},
			}
			_, _, err := in.store.KeyInsert(ctx, p)
			if err == nil {
				// The conflict path, and the read it may fall back on.
				p.Token = idempotency.NewToken()
				_, _, err = in.store.KeyInsert(ctx, p)
			}
			if err == nil {
				_, err = in.store.KeyGet(ctx, merchant, key)
			}
			if err == nil {
				err = in.store.KeyRelease(ctx, merchant, key, token)
			}
			errs[i] = err
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("warming up the store: %w", err)
	}
	return nil
}

// closeInstances closes what was opened of insts; an instance that never
// opened (the first failed, so the others were not tried) is nil.
func closeInstances(insts []*instance) {
	for _, in := range insts {
		if in == nil {
			continue
		}
		if in.db != nil {
			_ = in.db.Close()
		}
		if in.store != nil {
			_ = in.store.Close()
		}
	}
}

// instanceName is A, B, C, … for the first 26 instances.
func instanceName(m int) string {
	const letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
	if m >= 0 && m < len(letters) {
		return letters[m : m+1]
	}
	return fmt.Sprintf("#%d", m+1)
}

// attempt runs one attempt of it through the instance's strategy.
func (in *instance) attempt(ctx context.Context, res *Result, it *intent, a *Attempt) {
	ctx = withAttempt(ctx, a)
	switch in.opts.Strategy {
	case CheckThenAct:
		in.checkThenAct(ctx, res.Merchant, it, a)
	case LockedTransaction:
		in.lockedTransaction(ctx, res.Merchant, it, a)
	case InsertFirst:
		in.insertFirst(ctx, res.Merchant, it, a)
	}
}

// errNoAnswer marks an attempt that ended without an answer; it should not
// happen, and is reported as an error if it does.
var errNoAnswer = errors.New("the attempt ended without an answer")
