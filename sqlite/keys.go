package sqlite

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"time"

	"github.com/chargeonce/chargeonce"
)

// The statements on idempotency_keys. Every "now" is nowMicros, the
// database's clock; Go passes only durations.
const (
	// sqlKeyInsert is the insert-first step: ON CONFLICT DO NOTHING tells,
	// with no window, whether this attempt is the first. Parameters:
	// merchant, key, fingerprint, token, lease µs, charge id. A new record
	// has no expiry (NULL): it expires only once completed.
	sqlKeyInsert = `INSERT INTO idempotency_keys
	(merchant_id, key, fingerprint, token, state, lease_until, recovery_attempts,
	 charge_id, created_at, updated_at, expires_at)
VALUES (?1, ?2, ?3, ?4, 'processing', ` + nowMicros + ` + ?5, 0,
	?6, ` + nowMicros + `, ` + nowMicros + `, NULL)
ON CONFLICT (merchant_id, key) DO NOTHING
RETURNING created_at, lease_until, lease_until <= created_at`

	// keyColumns are the columns scanKey reads, in order. The time left
	// before expiry is computed here, by the database's clock (expires_at is
	// NULL while processing). "gone" is not part of KeyRecord: it tells
	// KeyInsert that the record is completed and past its expiry, so a new
	// intent may take the key. A processing record has no expiry and is
	// never gone.
	keyColumns = `k.merchant_id, k.key, k.fingerprint, k.token, k.state,
	k.lease_until, k.lease_until <= ` + nowMicros + `,
	max(0, k.lease_until - ` + nowMicros + `), k.recovery_attempts,
	k.lease_held, coalesce(k.acquirer_id, ''), max(0, ` + nowMicros + ` - coalesce(r.created_at, o.created_at, c.created_at)),
	k.response_status, k.response_body, k.created_at, k.expires_at,
	coalesce(max(k.expires_at - ` + nowMicros + `, 0), 0),
	coalesce(k.state = 'completed' AND k.expires_at <= ` + nowMicros + `, 0), ` + chargeColumnsC + `, ` + refundColumnsR + `, ` + operationColumnsO

	// keysFrom joins records of either kind to what they guard: a
	// refund's record (its charge_id holds the refund's id) to its refund
	// (r) and the refunded charge (c), a charge's to its charge (r NULL).
	keysFrom = `FROM idempotency_keys k LEFT JOIN refunds r ON r.id = k.charge_id
LEFT JOIN charge_operations o ON o.id = k.charge_id
JOIN charges c ON c.id = coalesce(r.charge_id, o.charge_id, k.charge_id)`

	sqlKeySelect = `SELECT ` + keyColumns + `
` + keysFrom + `
WHERE k.merchant_id = ?1 AND k.key = ?2`

	sqlKeySelectRowid = `SELECT ` + keyColumns + `
` + keysFrom + `
WHERE k.rowid = ?1`

	sqlKeyDelete = `DELETE FROM idempotency_keys WHERE merchant_id = ?1 AND key = ?2 AND state = 'completed'`

	// sqlKeyComplete is the compare-and-set on the owner's token; it starts
	// the record's time to live (?6 µs) now: a record expires after it
	// became final.
	sqlKeyComplete = `UPDATE idempotency_keys
SET state = 'completed', response_status = ?4, response_body = ?5,
	updated_at = ` + nowMicros + `, expires_at = ` + nowMicros + ` + ?6
WHERE merchant_id = ?1 AND key = ?2 AND token = ?3 AND state = 'processing'
RETURNING charge_id`

	sqlKeyRelease = `DELETE FROM idempotency_keys
WHERE merchant_id = ?1 AND key = ?2 AND token = ?3 AND state = 'processing' AND notify = 0
RETURNING charge_id`

	// sqlKeyReleaseNotified ends the lease of a flagged record instead of
	// deleting it (see KeyRelease).
	sqlKeyReleaseNotified = `UPDATE idempotency_keys
SET lease_until = ` + nowMicros + `, updated_at = ` + nowMicros + `
WHERE merchant_id = ?1 AND key = ?2 AND token = ?3 AND state = 'processing' AND notify = 1`

	sqlKeyLeaseSet = `UPDATE idempotency_keys
SET lease_until = ` + nowMicros + ` + ?4, lease_held = 0,
	recovery_attempts = recovery_attempts + ?5,
	updated_at = ` + nowMicros + `
WHERE merchant_id = ?1 AND key = ?2 AND token = ?3 AND state = 'processing'`

	sqlKeyClaim = `UPDATE idempotency_keys
SET token = ?3, lease_until = ` + nowMicros + ` + ?4, lease_held = 1, updated_at = ` + nowMicros + `
WHERE merchant_id = ?1 AND key = ?2 AND state = 'processing'
	AND lease_until <= ` + nowMicros + `
RETURNING rowid`

	// sqlKeysClaimable selects candidates for KeysClaimExpired, longest
	// orphaned first; the partial index on lease_until serves it.
	sqlKeysClaimable = `SELECT rowid FROM idempotency_keys
WHERE state = 'processing' AND lease_until <= ` + nowMicros + `
ORDER BY lease_until, rowid
LIMIT ?1`

	sqlKeyClaimRowid = `UPDATE idempotency_keys
SET token = ?2, lease_until = ` + nowMicros + ` + ?3, lease_held = 1, updated_at = ` + nowMicros + `
WHERE rowid = ?1 AND state = 'processing' AND lease_until <= ` + nowMicros

	// sqlKeysDeleteExpired deletes one batch of completed records past
	// expiry; the subquery bounds the work (and the time the write lock is
	// held) per call. A processing record is an unsettled charge: it stays,
	// whatever its expiry, until recovery completes it.
	sqlKeysDeleteExpired = `DELETE FROM idempotency_keys WHERE rowid IN (
	SELECT rowid FROM idempotency_keys
	WHERE state = 'completed' AND expires_at <= ` + nowMicros + `
	ORDER BY expires_at
	LIMIT ?1)`

	// sqlKeysStuck reports processing records whose lease has ended, and
	// those recovery already tried and failed to settle (while it backs them
	// off their lease lies in the future, but they are stuck all the same);
	// the age is that of the oldest such record since it was created.
	sqlKeysStuck = `SELECT count(*), coalesce(` + nowMicros + ` - min(created_at), 0)
FROM idempotency_keys
WHERE state = 'processing' AND (lease_until <= ` + nowMicros + ` OR recovery_attempts > 0)`
)

// rowScanner is *sql.Row or *sql.Rows.
type rowScanner interface {
	Scan(dest ...any) error
}

// scanKey reads keyColumns.
func scanKey(r rowScanner) (rec chargeonce.KeyRecord, gone bool, err error) {
	var (
		state            string
		leaseUntil       int64
		createdAt        int64
		expiresAt        sql.NullInt64
		expiresIn        int64
		responseStatus   sql.NullInt64
		responseBody     []byte
		recoveryAttempts int64
		remainingMicros  int64
		ageMicros        int64
	)
	dest := []any{
		&rec.MerchantID, &rec.Key, &rec.Fingerprint, &rec.Token, &state,
		&leaseUntil, &rec.LeaseExpired, &remainingMicros, &recoveryAttempts,
		&rec.LeaseHeld, &rec.AcquirerID, &ageMicros,
		&responseStatus, &responseBody, &createdAt, &expiresAt, &expiresIn, &gone,
	}
	var c chargeRow
	var rf refundRow
	var op operationRow
	dest = append(dest, c.dest()...)
	dest = append(dest, rf.nullDest()...)
	dest = append(dest, op.nullDest()...)
	if err := r.Scan(dest...); err != nil {
		return chargeonce.KeyRecord{}, false, err
	}
	rec.Refund = rf.refundOrNil()
	rec.Operation = op.operationOrNil()
	rec.State = chargeonce.KeyState(state)
	rec.LeaseUntil = fromMicros(leaseUntil)
	rec.LeaseRemaining = time.Duration(remainingMicros) * time.Microsecond
	rec.RecoveryAttempts = int(recoveryAttempts)
	rec.Age = time.Duration(ageMicros) * time.Microsecond
	if responseStatus.Valid {
		rec.ResponseStatus = int(responseStatus.Int64)
	}
	rec.ResponseBody = responseBody
	rec.CreatedAt = fromMicros(createdAt)
	if expiresAt.Valid {
		rec.ExpiresAt = fromMicros(expiresAt.Int64)
	}
	rec.ExpiresIn = time.Duration(expiresIn) * time.Microsecond
	rec.Charge = c.charge()
	return rec, gone, nil
}

// KeyInsert inserts the record and its processing charge in one IMMEDIATE
// transaction (shared with the writes waiting alongside, each in its own
// savepoint: group.go), insert first: INSERT ... ON CONFLICT DO NOTHING RETURNING
// says whether this attempt is the first, with no check-then-act window. When
// the key is taken, the existing record is read in the same transaction; if
// it is completed and past its expiry it is deleted (its charge is kept) and
// the insert is made afresh, since a key reused after expiry is a new intent.
// A processing record has no expiry and is always returned: its charge is
// not settled yet, and dropping the record would leave recovery nothing to
// find.
func (s *Store) KeyInsert(ctx context.Context, p chargeonce.KeyInsertParams) (chargeonce.KeyRecord, bool, error) {
	if err := p.CheckText(); err != nil {
		return chargeonce.KeyRecord{}, false, err // what PostgreSQL cannot store, SQLite refuses too
	}
	q, err := s.prepared(ctx)
	if err != nil {
		return chargeonce.KeyRecord{}, false, err
	}
	var (
		rec      chargeonce.KeyRecord
		inserted bool
	)
	err = s.write(ctx, "inserting idempotency key", func(ctx context.Context, tx *sql.Tx) error {
		var err error
		rec, inserted, err = s.keyInsertTx(ctx, tx, q, p)
		if err != nil || inserted {
			return err
		}
		existing, gone, err := scanKey(tx.StmtContext(ctx, q.keySelectW).QueryRowContext(ctx, p.Charge.MerchantID, p.Charge.IdempotencyKey))
		if err != nil {
			// The conflicting row is there: we hold the write lock.
			return wrap("reading existing idempotency key", err)
		}
		if !gone {
			rec = existing
			return nil
		}
		if _, err := tx.StmtContext(ctx, q.keyDelete).ExecContext(ctx, p.Charge.MerchantID, p.Charge.IdempotencyKey); err != nil {
			return wrap("deleting expired idempotency key", err)
		}
		if rec, inserted, err = s.keyInsertTx(ctx, tx, q, p); err != nil {
			return err
		}
		if !inserted {
			return errors.New("inserting idempotency key: still taken after deleting the expired record")
		}
		return nil
	})
	if err != nil {
		return chargeonce.KeyRecord{}, false, err
	}
	return rec, inserted, nil
}

// keyInsertTx runs the insert-first statement and, when it inserted, the
// processing charge.
func (s *Store) keyInsertTx(ctx context.Context, tx *sql.Tx, q *queries, p chargeonce.KeyInsertParams) (chargeonce.KeyRecord, bool, error) {
	ch := p.Charge
	var createdAt, leaseUntil int64
	var leaseExpired bool
	err := tx.StmtContext(ctx, q.keyInsert).QueryRowContext(ctx,
		ch.MerchantID, ch.IdempotencyKey, p.Fingerprint, p.Token,
		micros(p.Lease), ch.ID,
	).Scan(&createdAt, &leaseUntil, &leaseExpired)
	if errors.Is(err, sql.ErrNoRows) {
		return chargeonce.KeyRecord{}, false, nil
	}
	if err != nil {
		return chargeonce.KeyRecord{}, false, wrap("inserting idempotency key", err)
	}
	insert := tx.StmtContext(ctx, q.chargeInsert).ExecContext
	if ch.CaptureMethod == chargeonce.CaptureManual {
		insert = func(ctx context.Context, args ...any) (sql.Result, error) {
			return tx.ExecContext(ctx, sqlChargeInsertManual, args...)
		}
	}
	if _, err := insert(ctx,
		ch.ID, ch.MerchantID, ch.IdempotencyKey, ch.OrderID, ch.AmountCents,
		ch.Currency, ch.PaymentToken, ch.Description, createdAt, chargeonce.MetadataText(ch.Metadata),
	); err != nil {
		return chargeonce.KeyRecord{}, false, wrap("inserting charge", err)
	}
	ch.Status = chargeonce.StatusProcessing
	ch.DeclineCode = ""
	ch.CreatedAt = fromMicros(createdAt)
	return chargeonce.KeyRecord{
		MerchantID:   ch.MerchantID,
		Key:          ch.IdempotencyKey,
		Fingerprint:  p.Fingerprint,
		Token:        p.Token,
		State:        chargeonce.KeyProcessing,
		LeaseUntil:   fromMicros(leaseUntil),
		LeaseExpired: leaseExpired,
		LeaseHeld:    true,
		CreatedAt:    ch.CreatedAt,
		Charge:       ch,

		// Both ends are the database's clock, read by the insert itself.
		LeaseRemaining: time.Duration(max(0, leaseUntil-createdAt)) * time.Microsecond,
	}, true, nil
}

// KeyGet returns the record and its charge, or ENOTFOUND. It reads through
// the read pool.
func (s *Store) KeyGet(ctx context.Context, merchantID, key string) (chargeonce.KeyRecord, error) {
	if !chargeonce.ValidText(merchantID) || !chargeonce.ValidText(key) {
		return chargeonce.KeyRecord{}, chargeonce.Errorf(chargeonce.ENOTFOUND, "idempotency key %q not found", key)
	}
	q, err := s.prepared(ctx)
	if err != nil {
		return chargeonce.KeyRecord{}, err
	}
	rec, _, err := scanKey(q.keySelectR.QueryRowContext(ctx, merchantID, key))
	if errors.Is(err, sql.ErrNoRows) {
		return chargeonce.KeyRecord{}, chargeonce.Errorf(chargeonce.ENOTFOUND, "idempotency key not found")
	}
	if err != nil {
		return chargeonce.KeyRecord{}, wrap("reading idempotency key", err)
	}
	return rec, nil
}

// KeyComplete stores the final response and the charge's final status in one
// transaction, and sets the record to expire p.TTL from now (the database's
// clock), if and only if the record is still processing and owned by
// p.Token (a compare-and-set); otherwise ESTALE and nothing changes.
func (s *Store) KeyComplete(ctx context.Context, p chargeonce.KeyCompleteParams) error {
	q, err := s.prepared(ctx)
	if err != nil {
		return err
	}
	return s.write(ctx, "completing idempotency key", func(ctx context.Context, tx *sql.Tx) error {
		return keyCompleteTx(ctx, tx, q, p)
	})
}

// keyCompleteTx is KeyComplete's work inside tx: the one completion that
// attempts, recovery and operators' resolutions (ChargeResolve) share.
func keyCompleteTx(ctx context.Context, tx *sql.Tx, q *queries, p chargeonce.KeyCompleteParams) error {
	switch p.Kind {
	case chargeonce.KindRefund:
		return refundCompleteTx(ctx, tx, q, p)
	case chargeonce.KindCapture, chargeonce.KindCancel:
		return operationCompleteTx(ctx, tx, q, p)
	}
	chargeID, err := completeRecord(ctx, tx, q, p)
	if err != nil {
		return err
	}
	if _, err := tx.StmtContext(ctx, q.chargeComplete).ExecContext(ctx,
		chargeID, string(p.ChargeStatus), p.DeclineCode,
	); err != nil {
		return wrap("completing charge", err)
	}
	return nil
}

// completeRecord completes p's record of any kind inside tx, a
// compare-and-set on its token (ESTALE when the attempt no longer holds
// it), and returns the id of what it guards: a charge, a refund or an
// operation, for the kind to settle.
func completeRecord(ctx context.Context, tx *sql.Tx, q *queries, p chargeonce.KeyCompleteParams) (string, error) {
	var id string
	err := tx.StmtContext(ctx, q.keyComplete).QueryRowContext(ctx,
		p.MerchantID, p.Key, p.Token, p.ResponseStatus, p.ResponseBody, micros(p.TTL),
	).Scan(&id)
	if errors.Is(err, sql.ErrNoRows) {
		return "", stale(p.Key)
	}
	if err != nil {
		return "", wrap("completing idempotency key", err)
	}
	return id, nil
}

// KeyRelease deletes a processing record and its charge when token owns it,
// so that a retry starts afresh; otherwise ESTALE. A record flagged by
// KeyNotify is kept instead, its lease ended, so that the answer a queue
// message was promised still reaches the outbox (see chargeonce.Store).
func (s *Store) KeyRelease(ctx context.Context, merchantID, key, token string) error {
	q, err := s.prepared(ctx)
	if err != nil {
		return err
	}
	tx, err := s.wdb.BeginTx(ctx, nil)
	if err != nil {
		return wrap("releasing idempotency key: beginning transaction", err)
	}
	defer rollback(tx)

	var chargeID string
	err = tx.StmtContext(ctx, q.keyRelease).QueryRowContext(ctx, merchantID, key, token).Scan(&chargeID)
	if errors.Is(err, sql.ErrNoRows) {
		// Not deleted: stale, or flagged for the outbox and kept.
		res, err := tx.ExecContext(ctx, sqlKeyReleaseNotified, merchantID, key, token)
		if err != nil {
			return wrap("releasing idempotency key flagged for the outbox", err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return wrap("releasing idempotency key flagged for the outbox", err)
		}
		if n == 0 {
			return stale(key)
		}
		if err := tx.Commit(); err != nil {
			return wrap("releasing idempotency key: committing", err)
		}
		return nil
	}
	if err != nil {
		return wrap("releasing idempotency key", err)
	}
	if _, err := tx.StmtContext(ctx, q.chargeDelete).ExecContext(ctx, chargeID); err != nil {
		return wrap("deleting released charge", err)
	}
	if err := tx.Commit(); err != nil {
		return wrap("releasing idempotency key: committing", err)
	}
	return nil
}

// KeyLeaseSet moves the end of token's lease to now()+d by the database's
// clock and, when recoveryAttempt is true, counts one more recovery attempt.
// ESTALE when token no longer owns a processing record.
func (s *Store) KeyLeaseSet(ctx context.Context, merchantID, key, token string, d time.Duration, recoveryAttempt bool) error {
	q, err := s.prepared(ctx)
	if err != nil {
		return err
	}
	var inc int64
	if recoveryAttempt {
		inc = 1
	}
	res, err := q.keyLeaseSet.ExecContext(ctx, merchantID, key, token, micros(d), inc)
	if err != nil {
		return wrap("setting idempotency key lease", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return wrap("setting idempotency key lease", err)
	}
	if n == 0 {
		return stale(key)
	}
	return nil
}

// KeyAcquirerIDSet records the acquirer's own id for the charge's
// reference while token owns the processing record.
func (s *Store) KeyAcquirerIDSet(ctx context.Context, merchantID, key, token, acquirerID string) error {
	if !chargeonce.ValidText(acquirerID) {
		return chargeonce.FieldError("acquirer_id", "the acquirer's id must be valid UTF-8 without U+0000")
	}
	return s.write(ctx, "recording the acquirer's id", func(ctx context.Context, tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `UPDATE idempotency_keys SET acquirer_id = ?4, updated_at = `+nowMicros+`
WHERE merchant_id = ?1 AND key = ?2 AND token = ?3 AND state = 'processing'`, merchantID, key, token, acquirerID)
		if err != nil {
			return wrap("recording the acquirer's id", err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return wrap("recording the acquirer's id", err)
		}
		if n == 0 {
			return stale(key)
		}
		return nil
	})
}

// KeyClaim takes over one processing record whose lease has ended (by the
// database's clock), giving it newToken and a lease of lease. When the record
// is completed or its lease is still running, claimed is false and rec is the
// record as it is; when there is no record, the error is ENOTFOUND.
func (s *Store) KeyClaim(ctx context.Context, merchantID, key, newToken string, lease time.Duration) (chargeonce.KeyRecord, bool, error) {
	q, err := s.prepared(ctx)
	if err != nil {
		return chargeonce.KeyRecord{}, false, err
	}
	tx, err := s.wdb.BeginTx(ctx, nil)
	if err != nil {
		return chargeonce.KeyRecord{}, false, wrap("claiming idempotency key: beginning transaction", err)
	}
	defer rollback(tx)

	var rowid int64
	err = tx.StmtContext(ctx, q.keyClaim).QueryRowContext(ctx, merchantID, key, newToken, micros(lease)).Scan(&rowid)
	if errors.Is(err, sql.ErrNoRows) {
		// Not claimable: answer with the record as it is, read under the
		// same write lock, so the caller can tell why.
		rec, _, err := scanKey(tx.StmtContext(ctx, q.keySelectW).QueryRowContext(ctx, merchantID, key))
		if errors.Is(err, sql.ErrNoRows) {
			return chargeonce.KeyRecord{}, false, chargeonce.Errorf(chargeonce.ENOTFOUND, "idempotency key not found")
		}
		if err != nil {
			return chargeonce.KeyRecord{}, false, wrap("reading unclaimed idempotency key", err)
		}
		return rec, false, nil
	}
	if err != nil {
		return chargeonce.KeyRecord{}, false, wrap("claiming idempotency key", err)
	}
	rec, _, err := scanKey(tx.StmtContext(ctx, q.keySelectRowidW).QueryRowContext(ctx, rowid))
	if err != nil {
		return chargeonce.KeyRecord{}, false, wrap("reading claimed idempotency key", err)
	}
	if err := tx.Commit(); err != nil {
		return chargeonce.KeyRecord{}, false, wrap("claiming idempotency key: committing", err)
	}
	return rec, true, nil
}

// KeysClaimExpired claims up to limit processing records whose lease has
// ended, longest orphaned first, giving each a fresh random token and a lease
// of lease. Candidates are selected and updated in one IMMEDIATE transaction
// on the single write connection, so two callers, in this process or another
// one on the same file, never claim the same record.
func (s *Store) KeysClaimExpired(ctx context.Context, lease time.Duration, limit int) ([]chargeonce.KeyRecord, error) {
	if limit <= 0 {
		return nil, nil
	}
	q, err := s.prepared(ctx)
	if err != nil {
		return nil, err
	}
	tx, err := s.wdb.BeginTx(ctx, nil)
	if err != nil {
		return nil, wrap("claiming expired idempotency keys: beginning transaction", err)
	}
	defer rollback(tx)

	rowids, err := claimableRowids(ctx, tx.StmtContext(ctx, q.keysClaimable), limit)
	if err != nil {
		return nil, err
	}
	claim := tx.StmtContext(ctx, q.keyClaimRowid)
	get := tx.StmtContext(ctx, q.keySelectRowidW)
	recs := make([]chargeonce.KeyRecord, 0, len(rowids))
	for _, rowid := range rowids {
		res, err := claim.ExecContext(ctx, rowid, newToken(), micros(lease))
		if err != nil {
			return nil, wrap("claiming expired idempotency key", err)
		}
		if n, err := res.RowsAffected(); err != nil || n == 0 {
			// Cannot happen while we hold the write lock; skip rather
			// than hand out a record we do not own.
			continue
		}
		rec, _, err := scanKey(get.QueryRowContext(ctx, rowid))
		if err != nil {
			return nil, wrap("reading claimed idempotency key", err)
		}
		recs = append(recs, rec)
	}
	if err := tx.Commit(); err != nil {
		return nil, wrap("claiming expired idempotency keys: committing", err)
	}
	return recs, nil
}

func claimableRowids(ctx context.Context, st *sql.Stmt, limit int) ([]int64, error) {
	rows, err := st.QueryContext(ctx, limit)
	if err != nil {
		return nil, wrap("selecting expired idempotency leases", err)
	}
	defer rows.Close()
	var ids []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			return nil, wrap("selecting expired idempotency leases", err)
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		return nil, wrap("selecting expired idempotency leases", err)
	}
	return ids, nil
}

// KeysDeleteExpired deletes up to limit completed records past their expiry
// (by the database's clock) and returns how many it deleted. Their charges
// are kept. Processing records have no expiry and are never deleted: each
// is a charge recovery has yet to settle.
func (s *Store) KeysDeleteExpired(ctx context.Context, limit int) (int, error) {
	if limit <= 0 {
		return 0, nil
	}
	q, err := s.prepared(ctx)
	if err != nil {
		return 0, err
	}
	res, err := q.keysDeleteExpire.ExecContext(ctx, limit)
	if err != nil {
		return 0, wrap("deleting expired idempotency keys", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, wrap("deleting expired idempotency keys", err)
	}
	return int(n), nil
}

// KeysStuck reports processing records whose lease has ended: how many, and
// how long ago the oldest of them was created.
func (s *Store) KeysStuck(ctx context.Context) (chargeonce.StuckStats, error) {
	q, err := s.prepared(ctx)
	if err != nil {
		return chargeonce.StuckStats{}, err
	}
	var count, ageMicros int64
	if err := q.keysStuck.QueryRowContext(ctx).Scan(&count, &ageMicros); err != nil {
		return chargeonce.StuckStats{}, wrap("counting stuck idempotency keys", err)
	}
	return chargeonce.StuckStats{
		Count:     int(count),
		OldestAge: time.Duration(ageMicros) * time.Microsecond,
	}, nil
}

func stale(key string) error {
	return chargeonce.Errorf(chargeonce.ESTALE, "idempotency key %q is no longer owned by this attempt", key)
}

// newToken returns a random token shaped like the engine's: 32 hex digits.
func newToken() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b) // crypto/rand.Read never fails on supported platforms
	return hex.EncodeToString(b)
}
