-- 0017: manual capture and void (mirrors the PostgreSQL migration).
-- charges gains capture_method (NULL automatic, 'manual') and
-- captured_cents (what a manual capture took; NULL for an automatic
-- charge), and its status the values 'authorized' and 'canceled'. SQLite
-- cannot change a CHECK in place, so charges is rebuilt (the documented
-- twelve-step way, inside Migrate's one transaction, rowids kept so that
-- ties in listings keep their order), its indexes and its settlement
-- trigger with it. No other trigger or view names charges. The trigger
-- now also records charge.captured and charge.canceled when an
-- authorization settles; an authorization records no event.
CREATE TABLE charges_new (
    id              TEXT    NOT NULL PRIMARY KEY,
    merchant_id     TEXT    NOT NULL,
    idempotency_key TEXT    NOT NULL,
    order_id        INTEGER NOT NULL,
    amount_cents    INTEGER NOT NULL,
    currency        TEXT    NOT NULL,
    payment_token   TEXT    NOT NULL,
    description     TEXT    NOT NULL DEFAULT '',
    status          TEXT    NOT NULL CHECK (status IN ('processing', 'authorized', 'captured', 'declined', 'canceled')),
    decline_code    TEXT,
    created_at      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL,
    metadata        TEXT,
    refunded_cents  INTEGER NOT NULL DEFAULT 0
        CHECK (refunded_cents >= 0 AND refunded_cents <= amount_cents),
    capture_method  TEXT CHECK (capture_method IS NULL OR capture_method = 'manual'),
    captured_cents  INTEGER CHECK (captured_cents IS NULL OR (captured_cents > 0 AND captured_cents <= amount_cents)),
    CHECK (refunded_cents <= coalesce(captured_cents, amount_cents))
) STRICT;

INSERT INTO charges_new (rowid, id, merchant_id, idempotency_key, order_id, amount_cents, currency,
    payment_token, description, status, decline_code, created_at, updated_at, metadata, refunded_cents)
SELECT rowid, id, merchant_id, idempotency_key, order_id, amount_cents, currency,
    payment_token, description, status, decline_code, created_at, updated_at, metadata, refunded_cents
FROM charges;

DROP TABLE charges;
ALTER TABLE charges_new RENAME TO charges;

CREATE INDEX charges_merchant_status_created
    ON charges (merchant_id, status, created_at, id);
CREATE INDEX charges_merchant_order_status_created
    ON charges (merchant_id, order_id, status, created_at, id);
-- The sweeper's scan for authorizations past their time to live.
CREATE INDEX charges_authorized_created ON charges (created_at) WHERE status = 'authorized';

CREATE TRIGGER charges_webhook_event
AFTER UPDATE OF status ON charges
FOR EACH ROW
WHEN (OLD.status = 'processing' AND NEW.status IN ('captured', 'declined'))
  OR (OLD.status = 'authorized' AND NEW.status IN ('captured', 'canceled'))
BEGIN
    INSERT OR IGNORE INTO webhook_events (id, merchant_id, charge_id, type, created_at)
    VALUES ('evt_' || substr(NEW.id, 4), NEW.merchant_id, NEW.id, 'charge.' || NEW.status,
            CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER) * 1000);
END;

-- Captures and cancels: at most one pending or succeeded per charge.
CREATE TABLE charge_operations (
    id              TEXT    NOT NULL PRIMARY KEY,
    merchant_id     TEXT    NOT NULL,
    idempotency_key TEXT    NOT NULL,
    charge_id       TEXT    NOT NULL,
    kind            TEXT    NOT NULL CHECK (kind IN ('capture', 'cancel')),
    amount_cents    INTEGER NOT NULL CHECK (amount_cents > 0),
    currency        TEXT    NOT NULL,
    status          TEXT    NOT NULL CHECK (status IN ('pending', 'succeeded', 'failed')),
    failure_reason  TEXT,
    created_at      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL
) STRICT;

CREATE UNIQUE INDEX charge_operations_one_live ON charge_operations (charge_id) WHERE status <> 'failed';
