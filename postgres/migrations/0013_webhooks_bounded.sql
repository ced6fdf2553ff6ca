-- 0013_webhooks_bounded: webhooks against a hostile merchant (SPEC
-- "Settlement events and webhooks").
--
-- At most one pending delivery per (event, endpoint): a partial unique
-- index, which POST /v1/events/{id}/redeliver upserts into (a redelivery of
-- an event already owed to an endpoint makes that delivery due now instead
-- of adding one). Before it, 27,017 redeliveries in 40 s left 432,288
-- pending deliveries.
--
-- A claim whose cost does not grow with another merchant's backlog: the
-- claim walks the enabled endpoints and reads each one's first due
-- deliveries from (endpoint_id, next_at, id), where it used to read the
-- whole queue in next_at order and scan past every row of a merchant held
-- at its limit (275-330 ms per claim behind 432,288 rows).
--
-- Plain CREATE INDEX takes a SHARE lock on webhook_deliveries while it
-- builds: new deliveries (and so settlements of merchants with an enabled
-- endpoint) wait for the build; reads go on. On a large table build the
-- indexes CONCURRENTLY by hand before upgrading, as 0007 says; IF NOT
-- EXISTS then skips them. (The runner's no-transaction steps wait 50 ms for
-- each lock, and a CONCURRENTLY build waits for every older snapshot in the
-- database: under load it times out, and leaves an invalid index that IF
-- NOT EXISTS then skips.)
--
-- The duplicates a previous release's redeliver left are marked failed, the
-- oldest of each kept, in the transaction that builds the unique index, so
-- that none is written between the two; a redeliver of the previous release
-- that races the build makes the step fail and run again. Once the index
-- exists, that release's redeliver of an event already owed fails (500)
-- instead of queueing a duplicate, until it is replaced.

-- chargeonce:step
CREATE INDEX IF NOT EXISTS webhook_deliveries_endpoint_due
    ON webhook_deliveries (endpoint_id, next_at, id) WHERE state = 'pending';

-- chargeonce:step
UPDATE webhook_deliveries d SET state = 'failed'
FROM (
    SELECT id FROM (
        SELECT id, row_number() OVER (PARTITION BY event_id, endpoint_id ORDER BY id) AS n
        FROM webhook_deliveries WHERE state = 'pending'
    ) x WHERE n > 1
) dup
WHERE d.id = dup.id;
CREATE UNIQUE INDEX IF NOT EXISTS webhook_deliveries_one_pending
    ON webhook_deliveries (event_id, endpoint_id) WHERE state = 'pending';

-- chargeonce:step
-- The queue in next_at order goes: with it, the planner, when its sample
-- of the table missed an endpoint, walked every due delivery looking for
-- that endpoint's first (seen: 50,002 rows read for one claimed behind
-- another merchant's 50,000). The previous release's claim, which read
-- it, sorts the due deliveries instead until it is replaced.
DROP INDEX IF EXISTS webhook_deliveries_due;

-- chargeonce:step
-- webhook_deliveries_endpoint_due serves what this one did (an endpoint's
-- pending deliveries, deleted or failed with it), for this release and the
-- previous one: one index fewer to write per delivery.
DROP INDEX IF EXISTS webhook_deliveries_endpoint;

-- chargeonce:step
-- The event types an endpoint receives (NULL: every type). The previous
-- release neither reads nor writes it: its endpoints receive every type.
ALTER TABLE webhook_endpoints ADD COLUMN enabled_events text[];

-- chargeonce:step
-- The fan-out owes an event only to the endpoints enabled for its type.
CREATE OR REPLACE FUNCTION webhook_fanout() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO webhook_deliveries (event_id, endpoint_id, merchant_id)
    SELECT n.id, e.id, n.merchant_id
    FROM recorded_events n
    JOIN webhook_endpoints e ON e.merchant_id = n.merchant_id AND e.status = 'enabled'
        AND (e.enabled_events IS NULL OR n.type = ANY (e.enabled_events));
    RETURN NULL;
END
$$;

-- chargeonce:step
-- What "recover failed since T" reads: an endpoint's failed deliveries.
CREATE INDEX IF NOT EXISTS webhook_deliveries_endpoint_failed
    ON webhook_deliveries (endpoint_id, created_at) WHERE state = 'failed';
