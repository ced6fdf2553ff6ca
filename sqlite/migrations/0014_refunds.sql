-- 0014: refunds (mirrors the PostgreSQL migration). A refund's idempotency
-- record is a row of idempotency_keys whose charge_id holds the refund's
-- id; charges.refunded_cents is the sum of the charge's refunds that have
-- not failed, and the CHECK refuses more refunded than captured (SQLite's
-- one writer serializes the statements that change it).
ALTER TABLE charges ADD COLUMN refunded_cents INTEGER NOT NULL DEFAULT 0
    CHECK (refunded_cents >= 0 AND refunded_cents <= amount_cents);

CREATE TABLE refunds (
    id              TEXT    NOT NULL PRIMARY KEY,
    merchant_id     TEXT    NOT NULL,
    idempotency_key TEXT    NOT NULL,
    charge_id       TEXT    NOT NULL,
    amount_cents    INTEGER NOT NULL CHECK (amount_cents > 0),
    currency        TEXT    NOT NULL,
    reason          TEXT    NOT NULL DEFAULT '',
    metadata        TEXT,
    status          TEXT    NOT NULL CHECK (status IN ('pending', 'succeeded', 'failed', 'canceled')),
    failure_reason  TEXT,
    created_at      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL
) STRICT;

CREATE INDEX refunds_merchant_charge ON refunds (merchant_id, charge_id, created_at DESC, id DESC);
CREATE INDEX refunds_merchant_created ON refunds (merchant_id, created_at DESC, id DESC);

-- Events of refunds (mirrors the PostgreSQL migration): refund.created on
-- insert; refund.updated and charge.refunded, refund.failed, or
-- refund.updated (canceled) on settlement; written by the statement that
-- inserts or settles the refund. A charge has several events now, so
-- webhook_events is rebuilt without its UNIQUE (charge_id), with a plain
-- index on it: an event's id is derived from what it is about (the
-- charge's id, or the refund's and a suffix per type), so the primary key
-- keeps each to one and INSERT OR IGNORE still finds it. The
-- fan-out trigger goes with the old table and is created again, as is the
-- charges' settlement trigger (0011), which names the table; the fan-out
-- keeps 0013's filter on the endpoint's enabled_events.
DROP TRIGGER charges_webhook_event;
CREATE TABLE webhook_events_new (
    id          TEXT    NOT NULL PRIMARY KEY,
    merchant_id TEXT    NOT NULL,
    charge_id   TEXT    NOT NULL,
    type        TEXT    NOT NULL,
    created_at  INTEGER NOT NULL,
    object_id   TEXT
) STRICT;
INSERT INTO webhook_events_new (id, merchant_id, charge_id, type, created_at)
SELECT id, merchant_id, charge_id, type, created_at FROM webhook_events;
DROP TABLE webhook_events;
ALTER TABLE webhook_events_new RENAME TO webhook_events;
CREATE INDEX webhook_events_merchant_created ON webhook_events (merchant_id, created_at, id);
CREATE INDEX webhook_events_charge ON webhook_events (charge_id);

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

CREATE TRIGGER charges_webhook_event
AFTER UPDATE OF status ON charges
FOR EACH ROW
WHEN OLD.status = 'processing' AND NEW.status IN ('captured', 'declined')
BEGIN
    INSERT OR IGNORE INTO webhook_events (id, merchant_id, charge_id, type, created_at)
    VALUES ('evt_' || substr(NEW.id, 4), NEW.merchant_id, NEW.id, 'charge.' || NEW.status,
            CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER) * 1000);
END;

CREATE TRIGGER refunds_created_events
AFTER INSERT ON refunds
FOR EACH ROW
BEGIN
    INSERT OR IGNORE INTO webhook_events (id, merchant_id, charge_id, object_id, type, created_at)
    VALUES ('evt_' || substr(NEW.id, 4) || '_c', NEW.merchant_id, NEW.charge_id, NEW.id, 'refund.created', NEW.created_at);
END;

CREATE TRIGGER refunds_settled_events
AFTER UPDATE OF status ON refunds
FOR EACH ROW
WHEN OLD.status = 'pending' AND NEW.status IN ('succeeded', 'failed', 'canceled')
BEGIN
    INSERT OR IGNORE INTO webhook_events (id, merchant_id, charge_id, object_id, type, created_at)
    SELECT 'evt_' || substr(NEW.id, 4) || e.suffix, NEW.merchant_id, NEW.charge_id, NEW.id, e.type,
           CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER) * 1000
    FROM (SELECT 'succeeded' AS status, '_u' AS suffix, 'refund.updated' AS type
          UNION ALL SELECT 'succeeded', '_r', 'charge.refunded'
          UNION ALL SELECT 'failed', '_f', 'refund.failed'
          UNION ALL SELECT 'canceled', '_u', 'refund.updated') e
    WHERE e.status = NEW.status;
END;
