-- 0018: how many deliveries to an endpoint one instance has in flight at
-- once (mirrors the PostgreSQL migration). NULL is the default (16).
ALTER TABLE webhook_endpoints ADD COLUMN max_concurrency INTEGER CHECK (max_concurrency BETWEEN 1 AND 64);
