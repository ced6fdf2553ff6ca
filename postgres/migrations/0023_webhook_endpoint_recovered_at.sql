-- 0023_webhook_endpoint_recovered_at: when an endpoint was last recovered
-- ("recover failed since T"), so that a recovery comes at most once every
-- chargeonce.WebhookRecoverCooldown an endpoint, on every instance alike.
--
-- Expand only: a nullable column with no default is a catalog change
-- (ACCESS EXCLUSIVE on webhook_endpoints for an instant). The previous
-- release neither reads nor writes it.

-- chargeonce:step
ALTER TABLE webhook_endpoints ADD COLUMN IF NOT EXISTS recovered_at timestamptz;
