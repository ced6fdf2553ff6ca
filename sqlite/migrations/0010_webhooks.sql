-- 0010_webhooks: settlement events and their webhook deliveries (mirrors
-- the PostgreSQL migration).
--
-- The trigger on charges writes a charge's event when it leaves processing
-- and its merchant has an enabled endpoint, inside the transaction that
-- settled it; the trigger on webhook_events fans the event out to one
-- delivery per enabled endpoint. Times are unix microseconds.

CREATE TABLE webhook_endpoints (
    id               TEXT    NOT NULL PRIMARY KEY,
    merchant_id      TEXT    NOT NULL,
    url              TEXT    NOT NULL,
    description      TEXT    NOT NULL DEFAULT '',
    status           TEXT    NOT NULL DEFAULT 'enabled' CHECK (status IN ('enabled', 'disabled')),
    disabled_reason  TEXT,
    secret           TEXT    NOT NULL,
    old_secret       TEXT,
    old_secret_until INTEGER,
    failing_since    INTEGER,
    created_at       INTEGER NOT NULL
) STRICT;

CREATE INDEX webhook_endpoints_merchant ON webhook_endpoints (merchant_id, created_at, id);
CREATE INDEX webhook_endpoints_enabled ON webhook_endpoints (merchant_id) WHERE status = 'enabled';

CREATE TABLE webhook_events (
    id          TEXT    NOT NULL PRIMARY KEY,
    merchant_id TEXT    NOT NULL,
    charge_id   TEXT    NOT NULL UNIQUE,
    type        TEXT    NOT NULL,
    created_at  INTEGER NOT NULL
) STRICT;

CREATE INDEX webhook_events_merchant_created ON webhook_events (merchant_id, created_at, id);

CREATE TABLE webhook_deliveries (
    id            INTEGER NOT NULL PRIMARY KEY,
    event_id      TEXT    NOT NULL,
    endpoint_id   TEXT    NOT NULL,
    merchant_id   TEXT    NOT NULL,
    state         TEXT    NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'succeeded', 'failed')),
    attempts      INTEGER NOT NULL DEFAULT 0,
    next_at       INTEGER NOT NULL,
    claimed_until INTEGER NOT NULL DEFAULT 0,
    token         TEXT    NOT NULL DEFAULT '',
    created_at    INTEGER NOT NULL
) STRICT;

CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_at, id) WHERE state = 'pending';
CREATE INDEX webhook_deliveries_endpoint ON webhook_deliveries (endpoint_id) WHERE state = 'pending';

CREATE TABLE webhook_attempts (
    id          INTEGER NOT NULL PRIMARY KEY,
    event_id    TEXT    NOT NULL,
    endpoint_id TEXT    NOT NULL,
    at          INTEGER NOT NULL,
    status_code INTEGER,
    error       TEXT,
    latency_us  INTEGER NOT NULL
) STRICT;

CREATE INDEX webhook_attempts_event ON webhook_attempts (event_id, id);

CREATE TRIGGER charges_webhook_event
AFTER UPDATE OF status ON charges
FOR EACH ROW
WHEN OLD.status = 'processing' AND NEW.status IN ('captured', 'declined')
    AND EXISTS (SELECT 1 FROM webhook_endpoints w WHERE w.merchant_id = NEW.merchant_id AND w.status = 'enabled')
BEGIN
    INSERT OR IGNORE INTO webhook_events (id, merchant_id, charge_id, type, created_at)
    VALUES ('evt_' || substr(NEW.id, 4), NEW.merchant_id, NEW.id, 'charge.' || NEW.status,
            CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER) * 1000);
END;

CREATE TRIGGER webhook_events_fanout
AFTER INSERT ON webhook_events
FOR EACH ROW
BEGIN
    INSERT INTO webhook_deliveries (event_id, endpoint_id, merchant_id, next_at, created_at)
    SELECT NEW.id, e.id, NEW.merchant_id, NEW.created_at, NEW.created_at
    FROM webhook_endpoints e
    WHERE e.merchant_id = NEW.merchant_id AND e.status = 'enabled';
END;
