-- 0005: completed records keep a whole TTL from their settlement (mirrors the
-- PostgreSQL migration; SQLite has no 0004, whose fillfactor it lacks).
--
-- 0002 gave a new expiry only to completed records settled after the expiry
-- fixed at their insert (expires_at <= updated_at). A record settled before
-- that moment kept its insert's expiry: created 20 h ago with a TTL of 24 h
-- and settled 1 h ago, it expired in 4 h instead of 23 h, and a client
-- resuming its key after 4 h was charged again.
--
-- The TTL a record was inserted with is expires_at - created_at (0001 fixed
-- expires_at = created_at + TTL). Every completed record gets at least that
-- TTL from its settlement (updated_at): that moves its expiry by
-- updated_at - created_at, its settlement's delay. Records settled within a
-- second of their insert (almost all of them) are left alone: they would move
-- by milliseconds, and rewriting every record of a large table is what an
-- online migration must not do. A record already completed under 0002
-- (expires_at = updated_at + TTL) is kept its settlement's delay longer:
-- keeping a key longer is harmless; keeping it shorter charges twice.
UPDATE idempotency_keys
SET expires_at = updated_at + (expires_at - created_at)
WHERE state = 'completed' AND updated_at > created_at + 1000000;
