// Package sqlite implements chargeonce.Store on SQLite through
// modernc.org/sqlite, a pure-Go driver: the embedded default store, for a
// single host, for development and for tests.
//
// The store mirrors the PostgreSQL one: the same tables, the same
// insert-first protocol on UNIQUE (merchant_id, key), the same compare-and-set
// on the attempt's token, and the database's clock deciding leases and expiry.
// Times are stored as integer unix microseconds computed in SQL (nowMicros).
package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/chargeonce/chargeonce"
)

// DefaultBusyTimeout is how long a connection waits for a lock held by
// another process (another Store on the same file) before it gives up with
// SQLITE_BUSY. Within one Store, writes never wait on SQLite's lock: they
// queue for the single write connection in Go.
const DefaultBusyTimeout = 5 * time.Second

// MinReadConns is the smallest read pool a Store opens; larger machines get
// one read connection per CPU.
const MinReadConns = 4

// nowMicros is the database clock in unix microseconds, as SQL. SQLite's
// clock has millisecond resolution; ROUND guards against the float product
// landing just below a whole millisecond. SQLite keeps 'now' fixed for the
// whole of one statement, so every use within a statement agrees.
const nowMicros = "(CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER) * 1000)"

// Store is a chargeonce.Store on one SQLite database file.
//
// SQLite allows one writer at a time. Letting several connections race for
// the write lock makes them sleep and retry inside the busy handler (a
// SQLITE_BUSY storm under load, and an outright SQLITE_BUSY when a deferred
// transaction tries to upgrade its read lock). So every write goes through
// one *sql.DB limited to a single connection: writers queue in Go, in order,
// and each write transaction begins IMMEDIATE (the DSN's _txlock), taking the
// write lock at BEGIN. Pure reads use a separate pool of several connections:
// in WAL mode readers see the last committed state and neither block the
// writer nor wait for it.
type Store struct {
	path string
	wdb  *sql.DB // exactly one connection: every write
	rdb  *sql.DB // several read-only connections: pure reads

	group group // concurrent writes share transactions (group.go)

	mu      sync.Mutex // serialises preparing q
	q       atomic.Pointer[queries]
	closing atomic.Bool
}

var _ chargeonce.Store = (*Store)(nil)

// Open opens (creating if needed) the SQLite database at path, a file name
// such as "chargeonce.db" (the caller strips the "sqlite:" of --db). The
// database is put in WAL mode with synchronous=FULL, foreign keys on and a
// busy timeout of DefaultBusyTimeout. Open does not change the schema: call
// Migrate.
//
// In-memory databases are refused: each connection to ":memory:" would see
// a database of its own, and the store uses several connections. Tests use a
// file in a temporary directory.
func Open(ctx context.Context, path string) (*Store, error) {
	if path == "" {
		return nil, errors.New("opening sqlite database: empty path")
	}
	if strings.Contains(path, ":memory:") || strings.Contains(path, "mode=memory") {
		return nil, fmt.Errorf("opening sqlite database %q: in-memory databases are not supported, because each connection would see its own database; use a file", path)
	}
	if strings.ContainsAny(path, "?#") {
		return nil, fmt.Errorf("opening sqlite database %q: the path must not contain '?' or '#'", path)
	}

	busy := fmt.Sprintf("busy_timeout(%d)", DefaultBusyTimeout.Milliseconds())
	wq := url.Values{}
	wq.Add("_pragma", busy)
	wq.Add("_pragma", "journal_mode(WAL)")
	// synchronous=FULL, not the NORMAL usually paired with WAL: with NORMAL
	// a transaction that committed may roll back on power loss (the WAL is
	// not synced at each commit). The record committed before the acquirer
	// is called is exactly what must survive: if it vanished after the
	// money moved, the client's retry would insert a new record and charge
	// a new reference. FULL syncs the WAL at every commit; chargeonce bench
	// on SQLite reports what that costs (sqlite-sync in its output).
	wq.Add("_pragma", "synchronous(FULL)")
	wq.Add("_pragma", "foreign_keys(1)")
	// The savepoints of a shared transaction (group.go) keep the pages they
	// change in a sub-journal, which SQLite spills to a temporary file past
	// 64 KiB and deletes at commit: a group of refunds (three events each)
	// passed it, and opening and closing that file was 5% of serve's CPU
	// under bench --refunds. In memory it is bounded by the group's writes,
	// and only rolls a savepoint back: what commits is in the WAL.
	wq.Add("_pragma", "temp_store(MEMORY)")
	wq.Set("_txlock", "immediate")

	wdb, err := sql.Open("sqlite", path+"?"+wq.Encode())
	if err != nil {
		return nil, fmt.Errorf("opening sqlite database %q: %w", path, err)
	}
	wdb.SetMaxOpenConns(1)
	wdb.SetMaxIdleConns(1)
	wdb.SetConnMaxLifetime(0)
	wdb.SetConnMaxIdleTime(0)
	// Connect the writer first: it switches the file to WAL, which is
	// persistent, before any reader opens it.
	if err := connect(ctx, wdb); err != nil {
		_ = wdb.Close()
		return nil, fmt.Errorf("opening sqlite database %q: %w", path, err)
	}

	rq := url.Values{}
	rq.Add("_pragma", busy)
	rq.Add("_pragma", "foreign_keys(1)")
	// A read connection can never write, even by mistake.
	rq.Set("_query_only", "1")
	rdb, err := sql.Open("sqlite", path+"?"+rq.Encode())
	if err != nil {
		_ = wdb.Close()
		return nil, fmt.Errorf("opening sqlite database %q: %w", path, err)
	}
	n := max(MinReadConns, runtime.GOMAXPROCS(0))
	rdb.SetMaxOpenConns(n)
	rdb.SetMaxIdleConns(n)
	rdb.SetConnMaxLifetime(0)
	rdb.SetConnMaxIdleTime(0)
	if err := connect(ctx, rdb); err != nil {
		_ = rdb.Close()
		_ = wdb.Close()
		return nil, fmt.Errorf("opening sqlite database %q: %w", path, err)
	}

	var mode string
	if err := wdb.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode); err != nil {
		_ = rdb.Close()
		_ = wdb.Close()
		return nil, fmt.Errorf("opening sqlite database %q: reading journal mode: %w", path, err)
	}
	if !strings.EqualFold(mode, "wal") {
		_ = rdb.Close()
		_ = wdb.Close()
		return nil, fmt.Errorf("opening sqlite database %q: journal mode is %q, want wal", path, mode)
	}
	return &Store{path: path, wdb: wdb, rdb: rdb}, nil
}

// connect opens db's first connection, which runs the DSN's pragmas. While
// another process or Store switches a new file to WAL, that switch can
// answer SQLITE_BUSY at once: SQLite does not call the busy handler where
// waiting could deadlock. So a busy answer is retried for as long as the
// busy timeout lets any statement wait.
func connect(ctx context.Context, db *sql.DB) error {
	deadline := time.Now().Add(DefaultBusyTimeout)
	for {
		err := db.PingContext(ctx)
		var se *sqlite.Error
		if err == nil || !errors.As(err, &se) || se.Code()&0xff != sqlite3.SQLITE_BUSY || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// Ping reports whether the database file can be read.
func (s *Store) Ping(ctx context.Context) error {
	var n int
	// sqlite_schema lives in the file: unlike SELECT 1, this reads it.
	if err := s.rdb.QueryRowContext(ctx, "SELECT count(*) FROM sqlite_schema").Scan(&n); err != nil {
		return fmt.Errorf("pinging sqlite database: %w", translate(err))
	}
	return nil
}

// Close closes the prepared statements and both connection pools.
func (s *Store) Close() error {
	if !s.closing.CompareAndSwap(false, true) {
		return nil
	}
	var errs []error
	s.mu.Lock()
	if q := s.q.Load(); q != nil {
		errs = append(errs, q.close())
	}
	s.mu.Unlock()
	errs = append(errs, s.rdb.Close(), s.wdb.Close())
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("closing sqlite database: %w", err)
	}
	return nil
}

// DBs returns the store's single-connection write pool and its read pool.
// They are exported for the benchmark (package bench), whose bare handler
// must run the store's statements (Statements) on the same one-writer design;
// anything else should go through the Store's methods.
func (s *Store) DBs() (write, read *sql.DB) { return s.wdb, s.rdb }

// Statements are the SQL texts of a charge's hot path, exactly as the store
// runs them. KeyInsert, ChargeInsert, KeySelect (on conflict) and, after the
// acquirer, KeyComplete and ChargeComplete, each pair in one IMMEDIATE
// transaction on the write connection (an attempt alone; concurrent
// attempts share transactions, each in a savepoint: group.go). They are exported for the benchmark
// (package bench); nothing else should need them.
var Statements = struct {
	KeyInsert, ChargeInsert, KeySelect, KeyComplete, ChargeComplete string
}{sqlKeyInsert, sqlChargeInsert, sqlKeySelect, sqlKeyComplete, sqlChargeComplete}

// queries are the statements the store runs on every request, prepared once
// per connection pool and reused. Write statements are prepared on the write
// pool and used inside transactions through Tx.StmtContext, which reuses the
// statement already prepared on the single write connection.
type queries struct {
	// writes
	keyInsert        *sql.Stmt
	keyDelete        *sql.Stmt
	keySelectW       *sql.Stmt
	keySelectRowidW  *sql.Stmt
	chargeInsert     *sql.Stmt
	keyComplete      *sql.Stmt
	chargeComplete   *sql.Stmt
	keyRelease       *sql.Stmt
	chargeDelete     *sql.Stmt
	keyLeaseSet      *sql.Stmt
	keyClaim         *sql.Stmt
	keysClaimable    *sql.Stmt
	keyClaimRowid    *sql.Stmt
	keysDeleteExpire *sql.Stmt
	// refunds (refunds.go)
	refundAdd      *sql.Stmt
	refundInsert   *sql.Stmt
	refundComplete *sql.Stmt
	// reads
	keySelectR     *sql.Stmt
	keysStuck      *sql.Stmt
	chargeGet      *sql.Stmt
	chargesByOrder *sql.Stmt
}

func (q *queries) close() error {
	var errs []error
	for _, st := range []*sql.Stmt{
		q.keyInsert, q.keyDelete, q.keySelectW, q.keySelectRowidW, q.chargeInsert,
		q.keyComplete, q.chargeComplete, q.keyRelease, q.chargeDelete,
		q.keyLeaseSet, q.keyClaim, q.keysClaimable, q.keyClaimRowid,
		q.keysDeleteExpire, q.keySelectR, q.keysStuck, q.chargeGet, q.chargesByOrder,
		q.refundAdd, q.refundInsert, q.refundComplete,
	} {
		if st != nil {
			errs = append(errs, st.Close())
		}
	}
	return errors.Join(errs...)
}

// prepared returns the hot statements, preparing them on first use. They
// cannot be prepared in Open, which runs before Migrate has created the
// tables. It must be called before a write transaction begins: preparing on
// the write pool needs its only connection.
func (s *Store) prepared(ctx context.Context) (*queries, error) {
	if s.closing.Load() {
		return nil, translate(errClosed)
	}
	if q := s.q.Load(); q != nil {
		return q, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if q := s.q.Load(); q != nil {
		return q, nil
	}
	if s.closing.Load() {
		return nil, translate(errClosed)
	}
	q := &queries{}
	var err error
	prep := func(db *sql.DB, dst **sql.Stmt, query string) {
		if err != nil {
			return
		}
		*dst, err = db.PrepareContext(ctx, query)
	}
	prep(s.wdb, &q.keyInsert, sqlKeyInsert)
	prep(s.wdb, &q.keyDelete, sqlKeyDelete)
	prep(s.wdb, &q.keySelectW, sqlKeySelect)
	prep(s.wdb, &q.keySelectRowidW, sqlKeySelectRowid)
	prep(s.wdb, &q.chargeInsert, sqlChargeInsert)
	prep(s.wdb, &q.keyComplete, sqlKeyComplete)
	prep(s.wdb, &q.chargeComplete, sqlChargeComplete)
	prep(s.wdb, &q.keyRelease, sqlKeyRelease)
	prep(s.wdb, &q.chargeDelete, sqlChargeDelete)
	prep(s.wdb, &q.keyLeaseSet, sqlKeyLeaseSet)
	prep(s.wdb, &q.keyClaim, sqlKeyClaim)
	prep(s.wdb, &q.keysClaimable, sqlKeysClaimable)
	prep(s.wdb, &q.keyClaimRowid, sqlKeyClaimRowid)
	prep(s.wdb, &q.keysDeleteExpire, sqlKeysDeleteExpired)
	prep(s.wdb, &q.refundAdd, sqlRefundAdd)
	prep(s.wdb, &q.refundInsert, sqlRefundInsert)
	prep(s.wdb, &q.refundComplete, sqlRefundComplete)
	prep(s.rdb, &q.keySelectR, sqlKeySelect)
	prep(s.rdb, &q.keysStuck, sqlKeysStuck)
	prep(s.rdb, &q.chargeGet, sqlChargeGet)
	prep(s.rdb, &q.chargesByOrder, sqlChargesByOrder)
	if err != nil {
		_ = q.close()
		return nil, fmt.Errorf("preparing sqlite statements (has the schema been migrated?): %w", translate(err))
	}
	s.q.Store(q)
	return q, nil
}

// errClosed is returned by a Store used after Close.
var errClosed = errors.New("sqlite store is closed")

// translate maps driver errors the caller can act on to chargeonce codes,
// keeping the original error in the chain. A busy or locked database (another
// process held the write lock past the busy timeout) is EUNAVAILABLE: the
// request may be retried. So is a file that cannot be read or written (an
// I/O error, a full disk, a file that cannot be opened): whether a write
// that failed that way reached the file is unknown, so the client retries
// with the same key rather than being told of a bug (500). An interrupted
// statement, a deadline, memory running out and a lock-protocol error are
// the moment's too, never the statement's.
func translate(err error) error {
	// A closed store (the instance is shutting down) cannot answer now;
	// another instance can.
	if errors.Is(err, errClosed) || errors.Is(err, sql.ErrConnDone) || (err != nil && (strings.Contains(err.Error(), "sql: database is closed") || strings.Contains(err.Error(), "sql: statement is closed"))) {
		return fmt.Errorf("%w: %w", chargeonce.Errorf(chargeonce.EUNAVAILABLE, "the database is closed: this instance is shutting down; retry"), err)
	}
	// A deadline that ended the operation (database/sql returns it for a
	// statement it interrupted): the database was too slow now.
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%w: %w", chargeonce.Errorf(chargeonce.EUNAVAILABLE,
			"the database did not answer in time; the outcome is unknown: retry with the same Idempotency-Key"), err)
	}
	var se *sqlite.Error
	if errors.As(err, &se) {
		switch se.Code() & 0xff {
		case sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED, sqlite3.SQLITE_PROTOCOL,
			sqlite3.SQLITE_INTERRUPT, sqlite3.SQLITE_NOMEM:
			return fmt.Errorf("%w: %w", chargeonce.Errorf(chargeonce.EUNAVAILABLE, "the database is busy; retry shortly"), err)
		case sqlite3.SQLITE_IOERR, sqlite3.SQLITE_FULL, sqlite3.SQLITE_CANTOPEN:
			return fmt.Errorf("%w: %w", chargeonce.Errorf(chargeonce.EUNAVAILABLE,
				"the database file cannot be written; the outcome is unknown: retry with the same Idempotency-Key"), err)
		}
	}
	return err
}

// wrap says what failed, after translate.
func wrap(what string, err error) error {
	return fmt.Errorf("%s: %w", what, translate(err))
}

// rollback ends tx if Commit was not reached. The error is of no interest:
// either the transaction is already done or the operation already failed.
func rollback(tx *sql.Tx) { _ = tx.Rollback() }

// micros converts a duration to the store's unit.
func micros(d time.Duration) int64 { return d.Microseconds() }

// fromMicros converts a stored time to a UTC time.Time.
func fromMicros(us int64) time.Time { return time.UnixMicro(us).UTC() }
