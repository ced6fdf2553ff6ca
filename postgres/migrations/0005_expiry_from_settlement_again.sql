-- 0005: completed records keep a whole TTL from their settlement.
--
-- 0002 gave a new expiry only to completed records settled after the expiry
-- fixed at their insert (expires_at <= updated_at). A record settled before
-- that moment kept its insert's expiry: created 20 h ago with a TTL of 24 h
-- and settled 1 h ago, it expired in 4 h instead of 23 h, and a client
-- resuming its key after 4 h was charged again.
--
-- The TTL a record was inserted with is expires_at - created_at (0001 fixed
-- expires_at = created_at + TTL). Every completed record gets at least that
-- TTL from its settlement (updated_at). A record already completed under
-- 0002 (expires_at = updated_at + TTL) gets at most updated_at - created_at
-- more: its settlement's delay, milliseconds for almost every record. Keeping
-- a key longer is harmless; keeping it shorter charges twice.
UPDATE idempotency_keys
SET expires_at = updated_at + (expires_at - created_at)
WHERE state = 'completed' AND expires_at < updated_at + (expires_at - created_at);
