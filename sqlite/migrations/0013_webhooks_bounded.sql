-- 0013_webhooks_bounded: at most one pending delivery per (event, endpoint),
-- and a claim that reads each endpoint's first due deliveries (mirrors the
-- PostgreSQL migration). Duplicates left by earlier redeliveries are marked
-- failed, the oldest of each pair kept.

UPDATE webhook_deliveries SET state = 'failed'
WHERE state = 'pending' AND EXISTS (SELECT 1 FROM webhook_deliveries o
    WHERE o.event_id = webhook_deliveries.event_id AND o.endpoint_id = webhook_deliveries.endpoint_id
        AND o.state = 'pending' AND o.id < webhook_deliveries.id);

CREATE UNIQUE INDEX webhook_deliveries_one_pending ON webhook_deliveries (event_id, endpoint_id) WHERE state = 'pending';

CREATE INDEX webhook_deliveries_endpoint_due ON webhook_deliveries (endpoint_id, next_at, id) WHERE state = 'pending';

-- webhook_deliveries_endpoint_due serves what this one did.
DROP INDEX webhook_deliveries_endpoint;
