-- 0002: a record expires --key-ttl after it became final, never while it is
-- processing (SPEC "Key retention"). expires_at is NULL while processing and
-- set by KeyComplete to now() + the TTL.
--
-- Online: dropping NOT NULL changes only the catalog (no table rewrite, no
-- scan); its ACCESS EXCLUSIVE lock is held for that alone. The backfill then
-- walks the table in batches, each its own transaction: processing records
-- lose their expiry, and completed records settled after the expiry fixed
-- at their insert (settled late, by recovery, after a long acquirer outage)
-- get a whole TTL from their settlement: updated_at (their completion) plus
-- the TTL they were inserted with. The existing expires_at index keeps
-- serving the sweeper.
--
-- (Releases up to v0.3.0 ran this migration as one transaction; its result
-- is the same.)

-- chargeonce:step
ALTER TABLE idempotency_keys ALTER COLUMN expires_at DROP NOT NULL;

-- chargeonce:backfill idempotency_keys
UPDATE idempotency_keys
SET expires_at = CASE WHEN state = 'processing' THEN NULL
                      ELSE updated_at + (expires_at - created_at) END
WHERE ctid >= $1 AND ctid < $2
  AND ((state = 'processing' AND expires_at IS NOT NULL)
       OR (state = 'completed' AND expires_at <= updated_at));
