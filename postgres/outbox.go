package postgres

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/chargeonce/chargeonce"
)

// KeyNotify sets the record's notify flag while it is processing. The flag
// and the completing UPDATE meet on the row lock: if KeyComplete commits
// first, this UPDATE re-reads the row, finds it completed and flags nothing
// (the caller publishes the stored answer itself); if this commits first,
// KeyComplete's UPDATE builds its new row from the flagged one and the
// trigger writes the outbox row. Either way the answer is published.
func (s *Store) KeyNotify(ctx context.Context, merchantID, key string) (bool, error) {
	tag, err := s.pool.Exec(ctx, `
UPDATE idempotency_keys SET notify = true
WHERE merchant_id = $1 AND key = $2 AND state = $3`, merchantID, key, stateProcessing)
	if err != nil {
		return false, fmt.Errorf("flagging idempotency key for the outbox: %w", err)
	}
	return tag.RowsAffected() == 1, nil
}

// OutboxClaim holds up to limit unclaimed (or no longer held) rows for
// lease, oldest first. FOR UPDATE SKIP LOCKED lets concurrent publishers
// split the backlog; a row another publisher claimed after this statement's
// snapshot is re-checked against the WHERE clause when locked and left out.
func (s *Store) OutboxClaim(ctx context.Context, lease time.Duration, limit int) ([]chargeonce.OutboxEntry, error) {
	if limit <= 0 {
		return nil, nil
	}
	rows, err := s.pool.Query(ctx, `
WITH due AS (
	SELECT id FROM outbox
	WHERE claimed_until <= now()
	ORDER BY id
	LIMIT $2
	FOR UPDATE SKIP LOCKED
)
UPDATE outbox o SET claimed_until = now() + $1::interval
FROM due WHERE o.id = due.id
RETURNING o.id, o.merchant_id, o.key, o.response_status, o.response_body, o.created_at`, lease, limit)
	if err != nil {
		return nil, fmt.Errorf("claiming outbox entries: %w", err)
	}
	defer rows.Close()
	var out []chargeonce.OutboxEntry
	for rows.Next() {
		var e chargeonce.OutboxEntry
		if err := rows.Scan(&e.ID, &e.MerchantID, &e.Key, &e.ResponseStatus, &e.ResponseBody, &e.CreatedAt); err != nil {
			return nil, fmt.Errorf("claiming outbox entries: %w", err)
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("claiming outbox entries: %w", err)
	}
	// RETURNING follows no ORDER BY; publish oldest first.
	sortEntries(out)
	return out, nil
}

func sortEntries(es []chargeonce.OutboxEntry) {
	slices.SortFunc(es, func(a, b chargeonce.OutboxEntry) int { return cmp.Compare(a.ID, b.ID) })
}

// OutboxMarkSent deletes published rows.
func (s *Store) OutboxMarkSent(ctx context.Context, ids []int64) error {
	if len(ids) == 0 {
		return nil
	}
	if _, err := s.pool.Exec(ctx, `DELETE FROM outbox WHERE id = ANY($1)`, ids); err != nil {
		return fmt.Errorf("marking outbox entries sent: %w", err)
	}
	return nil
}

// OutboxStats counts unpublished rows and the age of the oldest.
func (s *Store) OutboxStats(ctx context.Context) (chargeonce.OutboxStats, error) {
	var st chargeonce.OutboxStats
	err := s.pool.QueryRow(ctx, `
SELECT count(*), COALESCE(now() - min(created_at), interval '0') FROM outbox`).Scan(&st.Count, &st.OldestAge)
	if err != nil {
		return chargeonce.OutboxStats{}, fmt.Errorf("counting outbox entries: %w", err)
	}
	return st, nil
}
