package sqlite

import (
	"cmp"
	"context"
	"encoding/json"
	"slices"
	"time"

	"github.com/chargeonce/chargeonce"
)

// KeyNotify sets the record's notify flag while it is processing. Writes are
// serialised through the one write connection, so the flag lands either
// before the completing UPDATE (whose trigger then writes the outbox row) or
// after it (and finds the record completed: flagged is false and the caller
// publishes the stored answer itself).
func (s *Store) KeyNotify(ctx context.Context, merchantID, key string) (bool, error) {
	res, err := s.wdb.ExecContext(ctx, `UPDATE idempotency_keys SET notify = 1
WHERE merchant_id = ?1 AND key = ?2 AND state = 'processing'`, merchantID, key)
	if err != nil {
		return false, wrap("flagging idempotency key for the outbox", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, wrap("flagging idempotency key for the outbox", err)
	}
	return n == 1, nil
}

// OutboxClaim holds up to limit unclaimed (or no longer held) rows for
// lease, oldest first, in one statement on the single writer: two callers
// run one after the other and never get the same row while it is held.
func (s *Store) OutboxClaim(ctx context.Context, lease time.Duration, limit int) ([]chargeonce.OutboxEntry, error) {
	if limit <= 0 {
		return nil, nil
	}
	rows, err := s.wdb.QueryContext(ctx, `UPDATE outbox SET claimed_until = `+nowMicros+` + ?1
WHERE id IN (
	SELECT id FROM outbox WHERE claimed_until <= `+nowMicros+` ORDER BY id LIMIT ?2)
RETURNING id, merchant_id, key, response_status, response_body, created_at`, micros(lease), limit)
	if err != nil {
		return nil, wrap("claiming outbox entries", err)
	}
	defer rows.Close()
	var out []chargeonce.OutboxEntry
	for rows.Next() {
		var (
			e         chargeonce.OutboxEntry
			createdAt int64
		)
		if err := rows.Scan(&e.ID, &e.MerchantID, &e.Key, &e.ResponseStatus, &e.ResponseBody, &createdAt); err != nil {
			return nil, wrap("claiming outbox entries", err)
		}
		e.CreatedAt = fromMicros(createdAt)
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, wrap("claiming outbox entries", err)
	}
	slices.SortFunc(out, func(a, b chargeonce.OutboxEntry) int { return cmp.Compare(a.ID, b.ID) })
	return out, nil
}

// OutboxMarkSent deletes published rows.
func (s *Store) OutboxMarkSent(ctx context.Context, ids []int64) error {
	if len(ids) == 0 {
		return nil
	}
	list, err := json.Marshal(ids)
	if err != nil {
		return wrap("marking outbox entries sent", err)
	}
	if _, err := s.wdb.ExecContext(ctx, `DELETE FROM outbox WHERE id IN (SELECT value FROM json_each(?1))`, string(list)); err != nil {
		return wrap("marking outbox entries sent", err)
	}
	return nil
}

// OutboxStats counts unpublished rows and the age of the oldest.
func (s *Store) OutboxStats(ctx context.Context) (chargeonce.OutboxStats, error) {
	var (
		n   int
		age int64
	)
	if err := s.rdb.QueryRowContext(ctx, `SELECT count(*), coalesce(`+nowMicros+` - min(created_at), 0) FROM outbox`).Scan(&n, &age); err != nil {
		return chargeonce.OutboxStats{}, wrap("counting outbox entries", err)
	}
	return chargeonce.OutboxStats{Count: n, OldestAge: time.Duration(age) * time.Microsecond}, nil
}
