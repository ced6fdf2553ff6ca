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

-- The queue in next_at order goes: a planner that misjudged an endpoint's
-- share walked it through every due delivery.
DROP INDEX webhook_deliveries_due;

-- webhook_deliveries_endpoint_due serves what this one did.
DROP INDEX webhook_deliveries_endpoint;

-- The event types an endpoint receives, a JSON array (NULL: every type);
-- the fan-out owes an event only to the endpoints enabled for its type.
ALTER TABLE webhook_endpoints ADD COLUMN enabled_events TEXT;

DROP TRIGGER webhook_events_fanout;

CREATE TRIGGER webhook_events_fanout
AFTER INSERT ON webhook_events
FOR EACH ROW
BEGIN
    INSERT INTO webhook_deliveries (event_id, endpoint_id, merchant_id, next_at, created_at)
    SELECT NEW.id, e.id, NEW.merchant_id, NEW.created_at, NEW.created_at
    FROM webhook_endpoints e
    WHERE e.merchant_id = NEW.merchant_id AND e.status = 'enabled'
        AND (e.enabled_events IS NULL OR EXISTS (SELECT 1 FROM json_each(e.enabled_events) WHERE value = NEW.type));
END;

-- What "recover failed since T" reads: an endpoint's failed deliveries.
CREATE INDEX webhook_deliveries_endpoint_failed ON webhook_deliveries (endpoint_id, created_at) WHERE state = 'failed';
