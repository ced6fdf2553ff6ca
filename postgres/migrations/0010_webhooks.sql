-- 0010_webhooks: settlement events and their webhook deliveries (SPEC
-- "Settlement events and webhooks").
--
-- The statement that completes an idempotency record (keyCompleteSQL and
-- keyCompleteBatchSQL) inserts the charge's event into webhook_events when
-- its merchant has an enabled endpoint, in the same statement, so an event
-- is never lost nor written for a charge that did not settle. A merchant
-- with no endpoint pays one probe of an empty partial index. The trigger
-- below fans an event out to one delivery per enabled endpoint; senders in
-- every instance claim due deliveries with a lease.
--
-- Online: new tables, functions and a trigger on a new table only; nothing
-- the previous release reads changes. Each DDL is a step of its own.

-- chargeonce:step
CREATE TABLE webhook_endpoints (
    id               text        PRIMARY KEY,
    merchant_id      text        NOT NULL,
    url              text        NOT NULL,
    description      text        NOT NULL DEFAULT '',
    status           text        NOT NULL DEFAULT 'enabled' CHECK (status IN ('enabled', 'disabled')),
    disabled_reason  text,
    secret           text        NOT NULL,
    -- A rotated-out secret keeps signing beside the new one until then.
    old_secret       text,
    old_secret_until timestamptz,
    -- The first failure since the last 2xx; NULL while deliveries succeed.
    failing_since    timestamptz,
    created_at       timestamptz NOT NULL DEFAULT now()
);

-- chargeonce:step
CREATE INDEX webhook_endpoints_merchant ON webhook_endpoints (merchant_id, created_at, id);

-- chargeonce:step
-- What the completion probes for every settlement: empty for merchants
-- without endpoints.
CREATE INDEX webhook_endpoints_enabled ON webhook_endpoints (merchant_id) WHERE status = 'enabled';

-- chargeonce:step
CREATE TABLE webhook_events (
    id          text        PRIMARY KEY,
    merchant_id text        NOT NULL,
    charge_id   text        NOT NULL UNIQUE,
    type        text        NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- chargeonce:step
CREATE INDEX webhook_events_merchant_created ON webhook_events (merchant_id, created_at, id);

-- chargeonce:step
CREATE TABLE webhook_deliveries (
    id            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id      text        NOT NULL,
    endpoint_id   text        NOT NULL,
    merchant_id   text        NOT NULL,
    state         text        NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'succeeded', 'failed')),
    attempts      integer     NOT NULL DEFAULT 0,
    next_at       timestamptz NOT NULL DEFAULT now(),
    -- A sender holds a delivery until claimed_until, under token.
    claimed_until timestamptz NOT NULL DEFAULT '-infinity',
    token         text        NOT NULL DEFAULT '',
    created_at    timestamptz NOT NULL DEFAULT now()
);

-- chargeonce:step
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_at, id) WHERE state = 'pending';

-- chargeonce:step
CREATE INDEX webhook_deliveries_endpoint ON webhook_deliveries (endpoint_id) WHERE state = 'pending';

-- chargeonce:step
CREATE TABLE webhook_attempts (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id    text        NOT NULL,
    endpoint_id text        NOT NULL,
    at          timestamptz NOT NULL DEFAULT now(),
    status_code integer,
    error       text,
    latency_us  bigint      NOT NULL
);

-- chargeonce:step
CREATE INDEX webhook_attempts_event ON webhook_attempts (event_id, id);

-- chargeonce:step
-- Pinned to the migration's search_path, like outbox_enqueue (0003).
CREATE FUNCTION webhook_fanout() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO webhook_deliveries (event_id, endpoint_id, merchant_id)
    SELECT NEW.id, e.id, NEW.merchant_id
    FROM webhook_endpoints e
    WHERE e.merchant_id = NEW.merchant_id AND e.status = 'enabled';
    RETURN NULL;
END
$$;

-- chargeonce:step
CREATE TRIGGER webhook_events_fanout
AFTER INSERT ON webhook_events
FOR EACH ROW EXECUTE FUNCTION webhook_fanout();
