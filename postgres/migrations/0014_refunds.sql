-- 0014: refunds (SPEC "Money going back").
--
-- A refund is guarded by an idempotency record like a charge's: a row of
-- idempotency_keys whose charge_id column holds the refund's id (re_…),
-- so refunds share the charges' leases, token compare-and-set, recovery
-- and expiry from settlement. A release before this one joins records to
-- charges and so never reads a refund's record as a charge's.
--
-- charges.refunded_cents is the sum of the charge's refunds that have not
-- failed: the statement inserting a refund adds to it under the charge's
-- row lock, the statement failing one takes its amount back, and the CHECK
-- makes the database refuse more refunded than captured, whatever the
-- concurrency.
--
-- Online: the column has a constant default (catalog only); the CHECK is
-- added NOT VALID (brief lock, no scan) and validated under SHARE UPDATE
-- EXCLUSIVE, which lets charges be written meanwhile; new tables and their
-- indexes.

-- chargeonce:step
ALTER TABLE charges ADD COLUMN refunded_cents bigint NOT NULL DEFAULT 0;

-- chargeonce:step
ALTER TABLE charges ADD CONSTRAINT charges_refunded_cents_check
    CHECK (refunded_cents >= 0 AND refunded_cents <= amount_cents) NOT VALID;

-- chargeonce:step
ALTER TABLE charges VALIDATE CONSTRAINT charges_refunded_cents_check;

-- chargeonce:step
-- Refunds are never deleted, like charges; their records expire.
CREATE TABLE refunds (
    id              text        PRIMARY KEY,
    merchant_id     text        NOT NULL,
    idempotency_key text        NOT NULL,
    charge_id       text        NOT NULL,
    amount_cents    bigint      NOT NULL CHECK (amount_cents > 0),
    currency        text        NOT NULL,
    reason          text        NOT NULL DEFAULT '',
    metadata        text,
    status          text        NOT NULL CHECK (status IN ('pending', 'succeeded', 'failed', 'canceled')),
    failure_reason  text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now()
);

-- chargeonce:step
-- GET /v1/refunds?charge_id=, newest first.
CREATE INDEX refunds_merchant_charge ON refunds (merchant_id, charge_id, created_at DESC, id DESC);

-- chargeonce:step
-- GET /v1/refunds, newest first.
CREATE INDEX refunds_merchant_created ON refunds (merchant_id, created_at DESC, id DESC);

-- Events of refunds (SPEC "Settlement events"): refund.created when a
-- refund is inserted, and when it settles refund.updated and
-- charge.refunded (succeeded), refund.failed (failed) or refund.updated
-- (canceled), each written by the statement that inserts or settles the
-- refund, by the triggers below. A refund's events carry its charge's id
-- in charge_id (GET /v1/events?charge_id= lists them with the charge's)
-- and the refund's in object_id. A charge has several events now, so
-- webhook_events' UNIQUE (charge_id) gives way to a plain index on it (the
-- same work per settlement as before): an event's id is derived from what
-- it is about (evt_ and the charge's id for a charge's settlement, the
-- refund's id and a suffix per type for a refund's), so the primary key
-- keeps each to one, and ON CONFLICT DO NOTHING, the previous release's
-- included, still finds it. The index is built before the constraint goes,
-- in a step of its own: a plain CREATE INDEX holds SHARE on webhook_events
-- while it builds, so settlements wait for the build (as 0007's do); on a
-- large events table build it CONCURRENTLY by hand before upgrading, and
-- IF NOT EXISTS skips it. (A no-transaction step would deadlock with
-- instances waiting on the migration lock: CONCURRENTLY waits for their
-- transactions.)

-- chargeonce:step
ALTER TABLE webhook_events ADD COLUMN object_id text;

-- chargeonce:step
CREATE INDEX IF NOT EXISTS webhook_events_charge ON webhook_events (charge_id);

-- chargeonce:step
ALTER TABLE webhook_events DROP CONSTRAINT IF EXISTS webhook_events_charge_id_key;

-- chargeonce:step
CREATE FUNCTION refunds_created_events() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO webhook_events (id, merchant_id, charge_id, object_id, type)
    SELECT 'evt_' || substr(n.id, 4) || '_c', n.merchant_id, n.charge_id, n.id, 'refund.created'
    FROM created n
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END
$$;

-- chargeonce:step
CREATE TRIGGER refunds_created_events
AFTER INSERT ON refunds
REFERENCING NEW TABLE AS created
FOR EACH STATEMENT EXECUTE FUNCTION refunds_created_events();

-- chargeonce:step
CREATE FUNCTION refunds_settled_events() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO webhook_events (id, merchant_id, charge_id, object_id, type)
    SELECT 'evt_' || substr(n.id, 4) || e.suffix, n.merchant_id, n.charge_id, n.id, e.type
    FROM settled_new n
    JOIN settled_old o ON o.id = n.id
    JOIN (VALUES ('succeeded', '_u', 'refund.updated'), ('succeeded', '_r', 'charge.refunded'),
                 ('failed', '_f', 'refund.failed'), ('canceled', '_u', 'refund.updated'))
        AS e(status, suffix, type) ON e.status = n.status
    WHERE o.status = 'pending'
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END
$$;

-- chargeonce:step
CREATE TRIGGER refunds_settled_events
AFTER UPDATE ON refunds
REFERENCING OLD TABLE AS settled_old NEW TABLE AS settled_new
FOR EACH STATEMENT EXECUTE FUNCTION refunds_settled_events();
