-- 0011_events_for_every_settlement: every settlement records exactly one
-- event, whoever settles it and whether or not its merchant has an enabled
-- endpoint (SPEC "Settlement events and webhooks": events are the log).
--
-- Under 0010 our completing statements wrote the event, and only for a
-- merchant with an enabled endpoint: a charge settled while its merchant
-- had none (no endpoint, or only a disabled one) had no event at all, and
-- the previous release's statements, which know nothing of events, settled
-- charges with none during a rolling upgrade. Now the database writes it:
-- a trigger on charges records an event for each charge that leaves
-- processing, in the statement and the transaction that settled it,
-- whichever statement and release that is (our own statements no longer
-- insert one). webhook_events' UNIQUE (charge_id) and ON CONFLICT DO
-- NOTHING keep it to one per charge.
--
-- Both triggers here are statement-level, with transition tables: a batch
-- of completions (postgres/batch_sql.go) records its events in one INSERT,
-- and their deliveries in one more, where row triggers would make two
-- PL/pgSQL calls per charge (docs/performance.md, "Settlement events").
-- The fan-out is unchanged otherwise: one delivery per endpoint enabled
-- when the event is recorded.
--
-- The backfill records the events of charges settled before the trigger
-- existed (by the previous release, or under 0010 for a merchant without
-- an enabled endpoint), with the time each charge settled. They fan out
-- like any other to the endpoints enabled when they are recorded: after an
-- upgrade from v0.3.0 there are none yet (0010 has just created the table).
--
-- Online: the fan-out swapped in one step (ACCESS EXCLUSIVE on
-- webhook_events, taken first and held for CREATE TRIGGER's weaker lock,
-- with nothing scanned); a function; a trigger on charges
-- (SHARE ROW EXCLUSIVE, brief), which waits for the settlements in flight,
-- so that every settlement committed without it is visible to the backfill
-- that follows; the backfill in batches of pages.

-- chargeonce:step
-- The fan-out becomes a statement trigger reading a transition table: its
-- row trigger (0010) goes, and its function changes, in the transaction
-- the statement trigger comes in, so no insert ever runs between the two.
-- Pinned to the migration's search_path, like outbox_enqueue (0003).
DROP TRIGGER webhook_events_fanout ON webhook_events;
CREATE OR REPLACE FUNCTION webhook_fanout() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO webhook_deliveries (event_id, endpoint_id, merchant_id)
    SELECT n.id, e.id, n.merchant_id
    FROM recorded_events n
    JOIN webhook_endpoints e ON e.merchant_id = n.merchant_id AND e.status = 'enabled';
    RETURN NULL;
END
$$;
CREATE TRIGGER webhook_events_fanout
AFTER INSERT ON webhook_events
REFERENCING NEW TABLE AS recorded_events
FOR EACH STATEMENT EXECUTE FUNCTION webhook_fanout();

-- chargeonce:step
CREATE FUNCTION charges_settlement_events() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO webhook_events (id, merchant_id, charge_id, type)
    SELECT 'evt_' || substr(n.id, 4), n.merchant_id, n.id, 'charge.' || n.status
    FROM settled_new n
    JOIN settled_old o ON o.id = n.id
    WHERE o.status = 'processing' AND n.status IN ('captured', 'declined')
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END
$$;

-- chargeonce:step
CREATE TRIGGER charges_settlement_events
AFTER UPDATE ON charges
REFERENCING OLD TABLE AS settled_old NEW TABLE AS settled_new
FOR EACH STATEMENT EXECUTE FUNCTION charges_settlement_events();

-- chargeonce:backfill charges
INSERT INTO webhook_events (id, merchant_id, charge_id, type, created_at)
SELECT 'evt_' || substr(c.id, 4), c.merchant_id, c.id, 'charge.' || c.status, c.updated_at
FROM charges c
WHERE c.ctid >= $1 AND c.ctid < $2 AND c.status IN ('captured', 'declined')
-- A charge that has its event is skipped by a probe of the unique index.
ON CONFLICT DO NOTHING
