// Package postgres is chargeonce's production store: chargeonce.Store on
// PostgreSQL through pgx v5.
//
// Every method is one statement in autocommit (data-modifying CTEs where a
// change spans both tables), so it costs one round trip, commits before it
// returns, and holds no row lock afterwards. Under load the inserts of
// concurrent attempts share one multi-row statement, their completions
// another, and both commit together (group commit, batch.go): still one
// commit per attempt's step, each attempt with its own outcome. In
// particular the record that guards an intent is committed before the
// engine calls the acquirer: a transaction held open across that call would
// make every retry wait on a row lock instead of getting its answer at once.
//
// Leases and expiry are decided by the database's clock (now()), never by an
// instance's, so instances with skewed clocks still agree on who owns what.
//
// Driver errors are translated here: pgx.ErrNoRows becomes a
// chargeonce.ENOTFOUND error, a lost compare-and-set on a token becomes
// chargeonce.ESTALE, a database that cannot be reached (or is shutting
// down, overloaded, or a read-only standby) becomes chargeonce.EUNAVAILABLE
// (errors.go), and everything is wrapped with what failed.
//
// The schema lives in migrations/ (embedded) and is applied by Migrate. All
// objects are created and queried unqualified, so the store works in
// whichever schema the connection's search_path names first.
//
// Requires PostgreSQL 13 or later (gen_random_uuid is built in from 13).
package postgres

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"github.com/chargeonce/chargeonce"
)

// DefaultMaxConns is the pool size when neither WithMaxConns nor the URL's
// pool_max_conns sets one. Every operation is a single short statement and
// no connection is held while the acquirer is called, so a small pool serves
// many concurrent requests; ten per instance also keeps a fleet of instances
// well under PostgreSQL's default max_connections of 100.
const DefaultMaxConns = 10

// keyInsertAttempts bounds how often KeyInsert goes round when the record it
// collided with disappears (released, or expired and deleted) before it can
// be read. Each round needs another attempt to delete the key in between, so
// running out means something is badly wrong, not that we are unlucky.
const keyInsertAttempts = 5

// Option configures Open.
type Option func(*options)

type options struct {
	maxConns    int
	maxConnsSet bool // else the URL's pool_max_conns, or DefaultMaxConns
	noBatching  bool
	// tracerProvider traces statements and batches (tracing.go); nil: off.
	tracerProvider trace.TracerProvider
}

// WithoutBatching makes every KeyInsert and KeyComplete run its own
// single-row statement instead of joining concurrent attempts in one
// statement (batch.go). For tests and measurements: the outcomes are the
// same, only slower under load.
func WithoutBatching() Option {
	return func(o *options) { o.noBatching = true }
}

// WithMaxConns sets the most connections the store opens to PostgreSQL. It
// takes precedence over pool_max_conns in the URL; n must be at least 1.
func WithMaxConns(n int) Option {
	return func(o *options) { o.maxConns, o.maxConnsSet = n, true }
}

// Store is chargeonce.Store on a pgx connection pool. It is safe for
// concurrent use by many goroutines, and many instances may share one
// database.
type Store struct {
	pool *pgxpool.Pool
	// batches coalesces concurrent attempts' KeyInsert and KeyComplete
	// (batch.go); nil with WithoutBatching.
	batches *batcher
	// pooled is true when Open found a pooler in front of PostgreSQL.
	pooled bool
	// deliveries is the webhook sender's own small pool (webhooks.go),
	// opened on first use.
	deliveries     *pgxpool.Pool
	deliveriesOnce sync.Once
}

var _ chargeonce.Store = (*Store)(nil)

// Open connects to the PostgreSQL database at connString (a postgres:// URL
// or a key=value DSN, as pgx accepts) and checks that it is reachable, so a
// wrong --db fails at start rather than on the first request. It does not
// migrate; call Migrate.
func Open(ctx context.Context, connString string, opts ...Option) (*Store, error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	cfg, err := pgxpool.ParseConfig(connString)
	if err != nil {
		return nil, fmt.Errorf("parsing PostgreSQL connection string: %w", err)
	}
	switch {
	case o.maxConnsSet && (o.maxConns < 1 || o.maxConns > math.MaxInt32):
		return nil, fmt.Errorf("opening PostgreSQL store: max conns must be at least 1, got %d", o.maxConns)
	case o.maxConnsSet:
		cfg.MaxConns = int32(o.maxConns) //nolint:gosec // G115: bounded to MaxInt32 by the case above
	case !strings.Contains(connString, "pool_max_conns"):
		cfg.MaxConns = DefaultMaxConns
	}
	// Nothing goes into the startup packet, so the store can run through a
	// pooler in transaction mode (PgBouncer), which refuses unknown startup
	// parameters and hands each transaction to whichever server connection
	// is free (docs/pooler.md). How statements are sent depends on which it
	// is; a URL's default_query_exec_mode wins.
	pooled, err := behindPooler(ctx, cfg.ConnConfig)
	if err != nil {
		return nil, fmt.Errorf("connecting to PostgreSQL at %s: %w", cfg.ConnConfig.Host, err)
	}
	switch {
	case strings.Contains(connString, "default_query_exec_mode"):
		// The URL's mode is kept, and the store still knows whether it
		// runs behind a pooler (Pooled).
	case pooled:
		// Behind a pooler no statement may be prepared under a name
		// (another client's transaction may get the server connection
		// next). QueryExecModeCacheDescribe sends each statement unnamed,
		// with its parameters, in one round trip, as QueryExecModeExec
		// does, but with the statement's parameter and result types
		// described once per connection and cached, so that parameters
		// and results travel in binary: the batches' arrays are not
		// written and parsed as text. Behind PgBouncer 1.18 it answered
		// as many new charges at 16 clients and 13-35% more at 64 than
		// QueryExecModeExec, in one run (docs/pooler.md). A
		// cached description outlives no schema change of ours: every
		// statement names its result columns, and migrations only expand
		// (CONTRIBUTING.md).
		cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
	default:
		// On a connection of its own the store keeps pgx's named
		// prepared statements, parsed once per connection: new charges
		// run 1.2-1.4 times faster than with unnamed ones, which a
		// custom plan on every run (plan_cache_mode) costs too
		// (docs/pooler.md). A generic plan cached while the tables
		// were small (a new deployment) is kept until the next ANALYZE;
		// with sequential scans off it at least walks an index. A
		// session setting is safe here: the session is the store's.
		cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
			_, err := c.Exec(ctx, "SET enable_seqscan = off")
			return err
		}
	}
	if cfg.MinConns > cfg.MaxConns {
		cfg.MinConns = cfg.MaxConns
	}
	o.applyTracing(cfg)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("opening PostgreSQL pool: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connecting to PostgreSQL at %s: %w", cfg.ConnConfig.Host, err)
	}
	s := &Store{pool: pool, pooled: pooled}
	if !o.noBatching {
		newBatchers(s)
		s.batches.tracer = o.batchTracer()
	}
	return s, nil
}

// Pool returns the store's connection pool, for the readiness check, metrics
// and tests that need to reach under the store.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// Pooled reports whether Open found a connection pooler between the store
// and PostgreSQL, and so sends every statement unnamed. It is false when the
// URL chose default_query_exec_mode itself (Open then does not look).
func (s *Store) Pooled() bool { return s.pooled }

// Ping reports whether the database is reachable.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.pool.Ping(ctx); err != nil {
		return fmt.Errorf("pinging PostgreSQL: %w", translate(err))
	}
	return nil
}

// Close waits for borrowed connections to come back and closes the pool.
func (s *Store) Close() error {
	s.closeDeliveryPool()
	s.pool.Close()
	return nil
}

// The columns of a record joined to its charge, in the order scanRecord
// reads them: k is an idempotency_keys row (table or CTE), c its charge.
// LeaseExpired, LeaseRemaining (in microseconds), the time left before
// expiry and whether the record has expired are computed here, by the
// database's clock. expires_at is NULL while the record is processing: it
// never expires then.
const recordColumns = `
	k.merchant_id, k.key, k.fingerprint, k.token, k.state,
	k.lease_until, k.lease_until <= now(),
	GREATEST(0, (EXTRACT(EPOCH FROM k.lease_until - now()) * 1000000)::bigint),
	k.recovery_attempts, k.lease_held, COALESCE(k.acquirer_id, ''),
	GREATEST(0, (EXTRACT(EPOCH FROM now() - c.created_at) * 1000000)::bigint),
	k.response_status, k.response_body, k.created_at, k.expires_at,
	COALESCE(GREATEST(k.expires_at - now(), interval '0'), interval '0'),
	COALESCE(k.expires_at <= now(), false),` + chargeColumnsC

// scanRecord scans recordColumns, optionally preceded by extra columns.
// expired reports whether the record was past its expiry when read.
func scanRecord(row pgx.Row, extra ...any) (rec chargeonce.KeyRecord, expired bool, err error) {
	var (
		state     string
		status    *int32
		expiresAt *time.Time
		remaining int64 // µs
		age       int64 // µs
		cs        chargeScan
	)
	dest := append(make([]any, 0, len(extra)+18+chargeScanColumns), extra...)
	dest = append(dest,
		&rec.MerchantID, &rec.Key, &rec.Fingerprint, &rec.Token, &state,
		&rec.LeaseUntil, &rec.LeaseExpired, &remaining, &rec.RecoveryAttempts,
		&rec.LeaseHeld, &rec.AcquirerID, &age,
		&status, &rec.ResponseBody, &rec.CreatedAt, &expiresAt,
		&rec.ExpiresIn, &expired,
	)
	if err := row.Scan(cs.dest(dest, &rec.Charge)...); err != nil {
		return chargeonce.KeyRecord{}, false, err
	}
	if err := cs.finish(&rec.Charge); err != nil {
		return chargeonce.KeyRecord{}, false, err
	}
	rec.State = chargeonce.KeyState(state)
	rec.LeaseRemaining = time.Duration(remaining) * time.Microsecond
	rec.Age = time.Duration(age) * time.Microsecond
	if status != nil {
		rec.ResponseStatus = int(*status)
	}
	if expiresAt != nil {
		rec.ExpiresAt = *expiresAt
	}
	return rec, expired, nil
}

// keyInsertSQL inserts the record and its charge and, when the key is taken,
// reads the record that took it, all in one statement and one round trip.
//
// The first branch returns the new record when the insert won. The second
// reads the existing record when it did not; it sees the statement's
// snapshot, so a record committed by a concurrent attempt while this
// statement waited on it is invisible there, and the statement then returns
// no row at all (KeyInsert reads again with a fresh snapshot). Replays of a
// record committed earlier, the common case, are answered in one round trip.
const keyInsertSQL = `
WITH k AS (
	INSERT INTO idempotency_keys
		(merchant_id, key, fingerprint, token, state, lease_until, charge_id)
	VALUES ($1, $2, $3, $4, 'processing', now() + $5::interval, $6)
	ON CONFLICT (merchant_id, key) DO NOTHING
	RETURNING *
), c AS (
	INSERT INTO charges
		(id, merchant_id, idempotency_key, order_id, amount_cents, currency, payment_token, description, status, metadata)
	SELECT $6, $1, $2, $7, $8, $9, $10, $11, 'processing', $12 FROM k
	RETURNING *
)
SELECT true, ` + recordColumns + `
FROM k JOIN c ON c.id = k.charge_id
UNION ALL
SELECT false, ` + recordColumns + `
FROM idempotency_keys k JOIN charges c ON c.id = k.charge_id
WHERE k.merchant_id = $1 AND k.key = $2 AND NOT EXISTS (SELECT FROM k)`

// keyGetSQL reads a record and its charge. It takes no row lock (no FOR
// UPDATE): the inserting attempt committed before calling the acquirer, so
// there is never a long transaction to wait behind, and a retry must get its
// answer (replay, 409 or 422) at once.
const keyGetSQL = `
SELECT ` + recordColumns + `
FROM idempotency_keys k JOIN charges c ON c.id = k.charge_id
WHERE k.merchant_id = $1 AND k.key = $2`

// keyCompleteSQL completes a record and its charge in one statement, as a
// compare-and-set on the owner's token, and starts the record's time to
// live ($8) now: a record expires after it became final. It returns how many
// records it completed (0 or 1). The charge's settlement event is not this
// statement's to write: the trigger on charges (migration 0011) records it,
// and its deliveries, in this statement, whichever statement settles the
// charge (the previous release's too) and whether or not its merchant has an
// endpoint.
const keyCompleteSQL = keyCompleteCTE + `, c AS (
	UPDATE charges
	SET status = $6, decline_code = NULLIF($7, ''), updated_at = now()
	FROM k WHERE charges.id = k.charge_id
)
SELECT count(*) FROM k`

// keyCompleteCTE completes the record ($1 merchant, $2 key) of any kind as
// a compare-and-set on its owner's token $3, storing the answer ($4, $5)
// and starting its time to live ($8) now; k returns the guarded object's id.
// keyCompleteSQL and refundCompleteSQL settle what it guards beside it.
const keyCompleteCTE = `
WITH k AS (
	UPDATE idempotency_keys
	SET state = 'completed', response_status = $4, response_body = $5, updated_at = now(),
		expires_at = now() + $8::interval
	WHERE merchant_id = $1 AND key = $2 AND token = $3 AND state = $9 -- stateProcessing (params.go)
	RETURNING charge_id
)`

// Statements are the SQL texts of a charge's hot path, exactly as the store
// runs them for an attempt alone (a batch of one, or WithoutBatching), with
// the parameters of KeyInsert, KeyGet and KeyComplete (KeyComplete's ninth
// is the state a record completes from, processing: params.go). They
// are exported for the benchmark (package bench), whose bare handler must run
// the very statements chargeonce runs; nothing else should need them.
var Statements = struct {
	KeyInsert, KeyGet, KeyComplete string
}{keyInsertSQL, keyGetSQL, keyCompleteSQL}

// KeyInsert writes first and lets the database refuse: INSERT ... ON
// CONFLICT DO NOTHING on the primary key (merchant_id, key), with the
// processing charge inserted by the same statement, so the record and its
// charge commit together or not at all. There is no check-then-act window:
// of any number of concurrent attempts exactly one gets inserted=true, and
// the others get the winner's record.
//
// A completed record past its expiry is deleted (its charge is kept) and
// the insert retried: a key reused after expiry is a new intent. A record
// still processing has no expiry: it is an unsettled charge that only
// recovery may finish, and deleting it would leave a charge the acquirer may
// have captured forever processing with nothing to re-drive it. The retry
// gets the existing record, and recovery settles it as usual.
//
// lease_until is now()+p.Lease on the database's clock; expires_at stays
// NULL until KeyComplete.
func (s *Store) KeyInsert(ctx context.Context, p chargeonce.KeyInsertParams) (chargeonce.KeyRecord, bool, error) {
	if err := p.CheckText(); err != nil {
		return chargeonce.KeyRecord{}, false, err
	}
	ch := p.Charge
	return s.insertLoop(ctx, insertKind{
		what: "inserting idempotency key", merchantID: ch.MerchantID, key: ch.IdempotencyKey, token: p.Token,
	}, func() (chargeonce.KeyRecord, bool, bool, error) { return s.insertRound(ctx, p) })
}

// insertKind is what differs between the inserts of a charge's, a
// refund's and an operation's record, for insertLoop.
type insertKind struct {
	what                   string // the errors' prefix: "inserting refund"
	merchantID, key, token string // the record's key and the attempt's token
	// refusal, when not nil, answers a round that wrote nothing for a
	// reason of the kind's: err is the round's error (handled false leaves
	// it to the loop), or pgx.ErrNoRows when no record holds the key on a
	// second look. Its answer is returned as it is; nil goes round again.
	refusal func(err error) (answer error, handled bool)
}

// insertLoop is the insert of every kind of record: a round of the kind's
// insert (round returns the record it inserted, inserted, or the one
// holding the key; pgx.ErrNoRows when it inserted none and saw none); a
// second look, with a fresh snapshot, when the round saw no record (the
// key is held by a record its snapshot cannot see: committed while it
// waited on it, or inserted by an attempt earlier in the same batch, or
// one a batch of new keys does not read, keyInsertNewBatchSQL; or the
// record vanished meanwhile); and, for a completed record past its
// expiry, its deletion and another round: a key reused after expiry is a
// new intent. A record still processing has no expiry: it is an unsettled
// charge, refund or operation that only recovery may finish, and the
// attempt gets it as the existing record.
//
// round is a parameter of its own, not a field of k, so that KeyInsert's
// closure stays on the stack: the common path allocates nothing more.
func (s *Store) insertLoop(ctx context.Context, k insertKind, round func() (rec chargeonce.KeyRecord, inserted, expired bool, err error)) (chargeonce.KeyRecord, bool, error) {
	for range keyInsertAttempts {
		rec, inserted, expired, err := round()
		if err != nil && !errors.Is(err, pgx.ErrNoRows) && k.refusal != nil {
			if answer, handled := k.refusal(err); handled {
				if answer != nil {
					return chargeonce.KeyRecord{}, false, answer
				}
				continue
			}
		}
		if errors.Is(err, pgx.ErrNoRows) {
			// Any kind of record holding the key is read: another kind's
			// request is another, so the attempt is answered 422.
			rec, expired, err = scanAnyRecord(s.pool.QueryRow(ctx, anyRecordGetSQL, k.merchantID, k.key))
			if errors.Is(err, pgx.ErrNoRows) {
				if k.refusal != nil {
					if answer, _ := k.refusal(err); answer != nil {
						return chargeonce.KeyRecord{}, false, answer
					}
				}
				continue // released or swept since: try the insert again
			}
			// A batch that failed after it committed (a connection lost on
			// COMMIT) was run again as single statements: the record may
			// be this very attempt's, which only it can hold the token of.
			inserted = err == nil && rec.Token == k.token
		}
		if err != nil {
			return chargeonce.KeyRecord{}, false, fmt.Errorf("%s: %w", k.what, translate(err))
		}
		if inserted {
			return rec, true, nil
		}
		if expired && rec.State == chargeonce.KeyCompleted {
			if err := s.deleteExpiredKey(ctx, k.merchantID, k.key); err != nil {
				return chargeonce.KeyRecord{}, false, err
			}
			continue
		}
		return rec, false, nil
	}
	return chargeonce.KeyRecord{}, false, fmt.Errorf("%s: the existing record kept disappearing; gave up after %d attempts", k.what, keyInsertAttempts)
}

// deleteExpiredKey deletes a completed record past its expiry, for
// insertLoop to insert the key again.
func (s *Store) deleteExpiredKey(ctx context.Context, merchantID, key string) error {
	if _, err := s.pool.Exec(ctx, `
		DELETE FROM idempotency_keys
		WHERE merchant_id = $1 AND key = $2 AND state = 'completed' AND expires_at <= now()`,
		merchantID, key); err != nil {
		return fmt.Errorf("deleting expired idempotency key: %w", translate(err))
	}
	return nil
}

// insertRound runs one round of KeyInsert's insert: in a batch with
// concurrent attempts, or alone. pgx.ErrNoRows means the key is held by a
// record the statement could not see.
func (s *Store) insertRound(ctx context.Context, p chargeonce.KeyInsertParams) (rec chargeonce.KeyRecord, inserted, expired bool, err error) {
	if s.batches == nil || p.Charge.CaptureMethod == chargeonce.CaptureManual {
		return s.insertOne(ctx, p)
	}
	j := &insertJob{jobState: jobState{ctx: ctx}, p: p}
	if err := s.batches.do(j); err != nil {
		return chargeonce.KeyRecord{}, false, false, err
	}
	return j.rec, j.inserted, j.expired, j.err
}

// insertOne is one round of KeyInsert's insert as a single statement.
func (s *Store) insertOne(ctx context.Context, p chargeonce.KeyInsertParams) (rec chargeonce.KeyRecord, inserted, expired bool, err error) {
	ch := p.Charge
	q := keyInsertSQL
	if ch.CaptureMethod == chargeonce.CaptureManual {
		q = keyInsertManualSQL
	}
	rec, expired, err = scanRecord(s.pool.QueryRow(ctx, q,
		ch.MerchantID, ch.IdempotencyKey, p.Fingerprint, p.Token, p.Lease, ch.ID,
		ch.OrderID, ch.AmountCents, ch.Currency, ch.PaymentToken, ch.Description,
		chargeonce.MetadataText(ch.Metadata),
	), &inserted)
	if err == nil && !inserted && rec.Token == p.Token {
		// Our own record: a batch this attempt was in committed it before
		// failing, and this retry of the insert found it.
		inserted = true
	}
	return rec, inserted, expired, err
}

// KeyGet returns the record and its charge, or ENOTFOUND. Like the read in
// KeyInsert it takes no row lock.
func (s *Store) KeyGet(ctx context.Context, merchantID, key string) (chargeonce.KeyRecord, error) {
	if !chargeonce.ValidText(merchantID) || !chargeonce.ValidText(key) {
		// text PostgreSQL cannot hold was never stored (storetest "Hostile")
		return chargeonce.KeyRecord{}, chargeonce.Errorf(chargeonce.ENOTFOUND, "idempotency key %q not found", key)
	}
	rec, _, err := scanRecord(s.pool.QueryRow(ctx, keyGetSQL, merchantID, key))
	if errors.Is(err, pgx.ErrNoRows) {
		// Not a charge's record: a refund's, or none. Only this rarer
		// path pays for the refunds join.
		rec, _, err = scanAnyRecord(s.pool.QueryRow(ctx, anyRecordGetSQL, merchantID, key))
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return chargeonce.KeyRecord{}, chargeonce.Errorf(chargeonce.ENOTFOUND, "idempotency key %q not found", key)
	}
	if err != nil {
		return chargeonce.KeyRecord{}, fmt.Errorf("reading idempotency key: %w", translate(err))
	}
	return rec, nil
}

// KeyComplete is a compare-and-set on the attempt's token: the record is
// completed (expiring p.TTL from now, by the database's clock) and its
// charge given its final status in one statement, and only if the record is
// still processing and p.Token still owns it. An attempt
// whose lease recovery took over finds its token replaced and gets ESTALE,
// so it can never overwrite the answer recovery stores.
func (s *Store) KeyComplete(ctx context.Context, p chargeonce.KeyCompleteParams) error {
	switch p.Kind {
	case chargeonce.KindRefund:
		return s.refundComplete(ctx, p)
	case chargeonce.KindCapture, chargeonce.KindCancel:
		return s.operationComplete(ctx, p)
	}
	if s.batches == nil {
		return s.completeOne(ctx, p, false)
	}
	j := &completeJob{jobState: jobState{ctx: ctx}, p: p}
	if err := s.batches.do(j); err != nil {
		return fmt.Errorf("completing idempotency key: %w", translate(err))
	}
	return j.err
}

// completeOne is KeyComplete as a single statement. retry is set when the
// attempt's batch failed: it may have committed before the failure was
// seen, so a record already completed under this attempt's token is this
// attempt's own completion, not a lost compare-and-set.
func (s *Store) completeOne(ctx context.Context, p chargeonce.KeyCompleteParams, retry bool) error {
	var n int
	err := s.pool.QueryRow(ctx, keyCompleteSQL,
		p.MerchantID, p.Key, p.Token, p.ResponseStatus, p.ResponseBody, string(p.ChargeStatus), p.DeclineCode, p.TTL, stateProcessing,
	).Scan(&n)
	if err != nil {
		return fmt.Errorf("completing idempotency key: %w", translate(err))
	}
	if n == 0 {
		return s.lostCompletion(ctx, p, retry)
	}
	return nil
}

// lostCompletion is the answer to a completion whose compare-and-set
// changed nothing: ESTALE, unless retry (the attempt's batch failed, and may
// have committed before the failure was seen) and the record is completed
// under the attempt's own token: then that was this attempt's completion.
func (s *Store) lostCompletion(ctx context.Context, p chargeonce.KeyCompleteParams, retry bool) error {
	if retry {
		if rec, err := s.KeyGet(ctx, p.MerchantID, p.Key); err == nil &&
			rec.State == chargeonce.KeyCompleted && rec.Token == p.Token {
			return nil
		}
	}
	return staleErr(p.Key)
}

// KeyRelease deletes a processing record and its processing charge, in one
// statement, when token still owns it; otherwise ESTALE and nothing changes.
// It is for attempts that failed before calling the acquirer: no money can
// have moved, so the retry may start afresh.
//
// A record flagged by KeyNotify is kept instead, its lease ended: a queue
// message was acked on the promise that its answer reaches the outbox, and a
// fresh record inserted by the retry would not carry the flag. Recovery or
// the retry drives it, and whoever completes it writes the outbox row.
//
// The charge is deleted by its id, a scalar subquery: joined to k with its
// status a constant, a generic plan cached on small tables walked
// charges_merchant_order_status_created_idx for every processing charge
// (89 ms a release; TestPlansMadeOnEmptyTablesUseIndexesAsTheyGrow).
func (s *Store) KeyRelease(ctx context.Context, merchantID, key, token string) error {
	var n int
	err := s.pool.QueryRow(ctx, `
WITH k AS (
	DELETE FROM idempotency_keys
	WHERE merchant_id = $1 AND key = $2 AND token = $3 AND state = $4 AND NOT notify
	RETURNING charge_id
), c AS (
	DELETE FROM charges
	WHERE id = (SELECT charge_id FROM k) AND status = 'processing'
), kept AS (
	UPDATE idempotency_keys SET lease_until = now(), updated_at = now()
	WHERE merchant_id = $1 AND key = $2 AND token = $3 AND state = $4 AND notify
	RETURNING 1
)
SELECT (SELECT count(*) FROM k) + (SELECT count(*) FROM kept)`, merchantID, key, token, stateProcessing).Scan(&n)
	if err != nil {
		return fmt.Errorf("releasing idempotency key: %w", translate(err))
	}
	if n == 0 {
		return chargeonce.Errorf(chargeonce.ESTALE, "idempotency key %q is no longer processing under this attempt's token", key)
	}
	return nil
}

// KeyLeaseSet moves the end of token's lease to now()+d on the database's
// clock, and counts a recovery attempt when recoveryAttempt is set. ESTALE
// when token no longer owns a processing record.
func (s *Store) KeyLeaseSet(ctx context.Context, merchantID, key, token string, d time.Duration, recoveryAttempt bool) error {
	tag, err := s.pool.Exec(ctx, `
UPDATE idempotency_keys
SET lease_until = now() + $4::interval, lease_held = false,
    recovery_attempts = recovery_attempts + CASE WHEN $5::boolean THEN 1 ELSE 0 END,
    updated_at = now()
WHERE merchant_id = $1 AND key = $2 AND token = $3 AND state = $6`,
		merchantID, key, token, d, recoveryAttempt, stateProcessing)
	if err != nil {
		return fmt.Errorf("setting idempotency key lease: %w", translate(err))
	}
	if tag.RowsAffected() == 0 {
		return chargeonce.Errorf(chargeonce.ESTALE, "idempotency key %q is no longer processing under this attempt's token", key)
	}
	return nil
}

// KeyAcquirerIDSet records the acquirer's own id for the charge's
// reference while token owns the processing record.
func (s *Store) KeyAcquirerIDSet(ctx context.Context, merchantID, key, token, acquirerID string) error {
	if !chargeonce.ValidText(acquirerID) {
		return chargeonce.FieldError("acquirer_id", "the acquirer's id must be valid UTF-8 without U+0000")
	}
	tag, err := s.pool.Exec(ctx, `
UPDATE idempotency_keys SET acquirer_id = $4, updated_at = now()
WHERE merchant_id = $1 AND key = $2 AND token = $3 AND state = $5`,
		merchantID, key, token, acquirerID, stateProcessing)
	if err != nil {
		return fmt.Errorf("recording the acquirer's id: %w", translate(err))
	}
	if tag.RowsAffected() == 0 {
		return chargeonce.Errorf(chargeonce.ESTALE, "idempotency key %q is no longer processing under this attempt's token", key)
	}
	return nil
}

// KeyClaim takes over one processing record whose lease has ended, in one
// UPDATE whose WHERE clause re-checks the lease: of two concurrent claimers
// the second waits for the first's row lock, re-evaluates the condition on
// the row the first wrote, finds a running lease and claims nothing.
//
// When nothing is claimed, rec is the record as it is now (still processing
// under another lease, or completed), so the caller can tell which; a
// record that does not exist is ENOTFOUND.
func (s *Store) KeyClaim(ctx context.Context, merchantID, key, newToken string, lease time.Duration) (chargeonce.KeyRecord, bool, error) {
	rec, _, err := scanAnyRecord(s.pool.QueryRow(ctx, `
WITH k AS (
	UPDATE idempotency_keys
	SET token = $3, lease_until = now() + $4::interval, lease_held = true, updated_at = now()
	WHERE merchant_id = $1 AND key = $2 AND state = $5 AND lease_until <= now()
	RETURNING *
)
SELECT `+refundColumns+`, `+operationColumns+`, `+recordColumns+`
FROM k`+anyRecordFrom, merchantID, key, newToken, lease, stateProcessing))
	if err == nil {
		return rec, true, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return chargeonce.KeyRecord{}, false, fmt.Errorf("claiming idempotency key: %w", translate(err))
	}
	rec, err = s.KeyGet(ctx, merchantID, key)
	if err != nil {
		return chargeonce.KeyRecord{}, false, err
	}
	return rec, false, nil
}

// KeysClaimExpired claims up to limit processing records whose lease has
// ended, oldest lease first, giving each a fresh random token and a lease of
// lease, in one statement.
//
// FOR UPDATE SKIP LOCKED lets concurrent recovery loops (one per instance)
// split the backlog instead of queueing behind each other; a row another
// loop claimed and committed after this statement's snapshot is re-checked
// by PostgreSQL against the WHERE clause when locked, finds its new lease
// running, and is left out. No record is claimed twice.
func (s *Store) KeysClaimExpired(ctx context.Context, lease time.Duration, limit int) ([]chargeonce.KeyRecord, error) {
	if limit <= 0 {
		return nil, nil
	}
	rows, err := s.pool.Query(ctx, `
WITH due AS (
	SELECT merchant_id, key FROM idempotency_keys
	WHERE state = 'processing' AND lease_until <= now()
	ORDER BY lease_until
	LIMIT $2
	FOR UPDATE SKIP LOCKED
), k AS (
	UPDATE idempotency_keys i
	SET token = gen_random_uuid()::text, lease_until = now() + $1::interval, lease_held = true, updated_at = now()
	FROM due
	WHERE i.merchant_id = due.merchant_id AND i.key = due.key
	RETURNING i.*
)
SELECT `+refundColumns+`, `+operationColumns+`, `+recordColumns+`
FROM k`+anyRecordFrom+`
ORDER BY k.created_at, k.merchant_id, k.key`, lease, limit)
	if err != nil {
		return nil, fmt.Errorf("claiming expired idempotency keys: %w", translate(err))
	}
	defer rows.Close()
	var recs []chargeonce.KeyRecord
	for rows.Next() {
		rec, _, err := scanAnyRecord(rows)
		if err != nil {
			return nil, fmt.Errorf("claiming expired idempotency keys: %w", translate(err))
		}
		recs = append(recs, rec)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("claiming expired idempotency keys: %w", translate(err))
	}
	return recs, nil
}

// KeysDeleteExpired deletes up to limit completed records past their expiry
// and returns how many it deleted; the sweeper calls it in a loop until it
// returns less than limit. Batches keep each statement's locks and WAL
// small. SKIP LOCKED lets two instances' sweepers work side by side.
//
// Charges are never deleted. Nor are records still processing: those are
// unsettled charges that recovery must finish, and it finds them through
// their record (see KeyInsert).
func (s *Store) KeysDeleteExpired(ctx context.Context, limit int) (int, error) {
	if limit <= 0 {
		return 0, nil
	}
	tag, err := s.pool.Exec(ctx, `
DELETE FROM idempotency_keys k
USING (
	SELECT merchant_id, key FROM idempotency_keys
	WHERE expires_at <= now() AND state = 'completed'
	ORDER BY expires_at
	LIMIT $1
	FOR UPDATE SKIP LOCKED
) due
WHERE k.merchant_id = due.merchant_id AND k.key = due.key`, limit)
	if err != nil {
		return 0, fmt.Errorf("deleting expired idempotency keys: %w", translate(err))
	}
	return int(tag.RowsAffected()), nil
}

// KeysStuck counts processing records whose lease has ended, and those
// recovery has already tried and failed to settle (recovery_attempts > 0).
// The latter matter most: while the acquirer is down, recovery backs each
// record off by moving its lease_until into the future, so counting expired
// leases alone would show an outage as zero stuck records between passes,
// exactly when operators need the gauge.
//
// OldestAge is the age of the oldest of them since it was created (not since
// its lease ended): how long that customer has been waiting for an answer,
// which is what an operator's alert should be about. Zero when there are
// none.
func (s *Store) KeysStuck(ctx context.Context) (chargeonce.StuckStats, error) {
	var st chargeonce.StuckStats
	err := s.pool.QueryRow(ctx, `
SELECT count(*), COALESCE(now() - min(created_at), interval '0')
FROM idempotency_keys
WHERE state = 'processing' AND (lease_until <= now() OR recovery_attempts > 0)`).Scan(&st.Count, &st.OldestAge)
	if err != nil {
		return chargeonce.StuckStats{}, fmt.Errorf("counting stuck idempotency keys: %w", translate(err))
	}
	return st, nil
}

const chargeColumns = `
	id, merchant_id, idempotency_key, order_id, amount_cents,
	currency, payment_token, description, status, decline_code, created_at, metadata,
	capture_method, captured_cents`

// chargeScan reads the columns of chargeColumns (or chargeColumnsC) into a
// charge, for every statement that reads one, alone or among other
// columns: dest appends the destinations, in the columns' order, to into
// (sized by the caller, so a statement's destinations cost one allocation),
// and finish
// converts what needs converting once the row is scanned. One list, so
// that no read of a charge drops a column the others read (the operators'
// reads once dropped capture_method and captured_cents).
type chargeScan struct {
	status                        string
	declineCode, metadata, method *string
	captured                      *int64
}

func (s *chargeScan) dest(into []any, c *chargeonce.Charge) []any {
	return append(into, &c.ID, &c.MerchantID, &c.IdempotencyKey, &c.OrderID, &c.AmountCents,
		&c.Currency, &c.PaymentToken, &c.Description, &s.status, &s.declineCode, &c.CreatedAt, &s.metadata,
		&s.method, &s.captured)
}

// chargeScanColumns is how many destinations chargeScan.dest appends.
const chargeScanColumns = 14

func (s *chargeScan) finish(c *chargeonce.Charge) error {
	var err error
	if c.Metadata, err = chargeonce.ParseMetadataText(s.metadata); err != nil {
		return err
	}
	c.Status = chargeonce.Status(s.status)
	if s.declineCode != nil {
		c.DeclineCode = *s.declineCode
	}
	// The capture method and captured amount are NULL for an automatic
	// charge.
	if s.method != nil {
		c.CaptureMethod = chargeonce.CaptureMethod(*s.method)
	}
	if s.captured != nil {
		c.CapturedCents = *s.captured
	}
	return nil
}

func scanCharge(row pgx.Row) (chargeonce.Charge, error) {
	var (
		c  chargeonce.Charge
		cs chargeScan
	)
	if err := row.Scan(cs.dest(make([]any, 0, chargeScanColumns), &c)...); err != nil {
		return chargeonce.Charge{}, err
	}
	if err := cs.finish(&c); err != nil {
		return chargeonce.Charge{}, err
	}
	return c, nil
}

// ChargeGet returns the merchant's charge. Another merchant's charge is
// ENOTFOUND, exactly like a charge that does not exist, so an API client
// cannot even learn that an id is in use.
func (s *Store) ChargeGet(ctx context.Context, merchantID, id string) (chargeonce.Charge, error) {
	if !chargeonce.ValidText(merchantID) || !chargeonce.ValidText(id) {
		return chargeonce.Charge{}, chargeonce.Errorf(chargeonce.ENOTFOUND, "charge %q not found", id)
	}
	// By id alone, then the owner: byID.
	c, err := scanCharge(s.pool.QueryRow(ctx, `SELECT `+chargeColumns+` FROM charges WHERE id = $1`, id))
	if notTheirs(err, c.MerchantID, merchantID) {
		return chargeonce.Charge{}, chargeonce.Errorf(chargeonce.ENOTFOUND, "charge %q not found", id)
	}
	if err != nil {
		return chargeonce.Charge{}, fmt.Errorf("reading charge: %w", translate(err))
	}
	return c, nil
}

// ChargesListByOrder returns the merchant's charges for orderID, newest
// first (ties broken by id, descending, so the order is total). It returns
// an empty, non-nil slice when there are none.
func (s *Store) ChargesListByOrder(ctx context.Context, merchantID string, orderID int64) ([]chargeonce.Charge, error) {
	if !chargeonce.ValidText(merchantID) {
		return []chargeonce.Charge{}, nil
	}
	rows, err := s.pool.Query(ctx, `
SELECT `+chargeColumns+` FROM charges
WHERE merchant_id = $1 AND order_id = $2
ORDER BY created_at DESC, id DESC`, merchantID, orderID)
	if err != nil {
		return nil, fmt.Errorf("listing charges by order: %w", translate(err))
	}
	defer rows.Close()
	charges := []chargeonce.Charge{}
	for rows.Next() {
		c, err := scanCharge(rows)
		if err != nil {
			return nil, fmt.Errorf("listing charges by order: %w", translate(err))
		}
		charges = append(charges, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("listing charges by order: %w", translate(err))
	}
	return charges, nil
}
