-- 0002: a record expires --key-ttl after it became final, never while it is
-- processing (SPEC "Key retention"). expires_at is NULL while processing and
-- set by KeyComplete to now() + the TTL.
--
-- Safe on a live database with data: dropping NOT NULL only changes the
-- catalog (no table rewrite), and the updates touch only the few processing
-- records (through the partial index on lease_until) and completed records
-- that were settled after the expiry fixed at their insert. Those were
-- settled late (recovery, after a long acquirer outage) and must be
-- replayed for a whole TTL from their settlement, so they get it:
-- updated_at (their completion) plus the TTL they were inserted with. The
-- existing expires_at index keeps serving the sweeper.
ALTER TABLE idempotency_keys ALTER COLUMN expires_at DROP NOT NULL;

UPDATE idempotency_keys SET expires_at = NULL WHERE state = 'processing';

UPDATE idempotency_keys
SET expires_at = updated_at + (expires_at - created_at)
WHERE state = 'completed' AND expires_at <= updated_at;
