-- 0018_webhook_endpoint_concurrency: how many deliveries to an endpoint one
-- instance has in flight at once, set per endpoint (max_concurrency on
-- POST /v1/webhook_endpoints and its update). NULL is the default (16,
-- chargeonce.DefaultEndpointConcurrency).
--
-- Expand only: a nullable column with no default is a catalog change
-- (ACCESS EXCLUSIVE on webhook_endpoints for an instant; its CHECK reads
-- the table once, a handful of rows per merchant). The previous release
-- neither reads nor writes it: its endpoints keep its limit of 16 per
-- merchant.

-- chargeonce:step
ALTER TABLE webhook_endpoints ADD COLUMN IF NOT EXISTS max_concurrency integer
    CONSTRAINT webhook_endpoints_max_concurrency_check CHECK (max_concurrency BETWEEN 1 AND 64);
