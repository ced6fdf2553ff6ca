-- 0023: when an endpoint was last recovered, unix microseconds (mirrors
-- the PostgreSQL migration).
ALTER TABLE webhook_endpoints ADD COLUMN recovered_at INTEGER;
