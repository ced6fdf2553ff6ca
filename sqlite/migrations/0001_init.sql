-- 0001_init: idempotency records and the charges they guard.
--
-- Mirrors the PostgreSQL schema. Every time is an INTEGER of unix microseconds
-- taken from the database's clock (see nowMicros in sqlite.go), so that lease
-- and expiry comparisons happen in SQL and never depend on an instance's clock.
-- Tables are STRICT: a value of the wrong type is an error, not a coercion.

CREATE TABLE idempotency_keys (
    merchant_id       TEXT    NOT NULL,
    key               TEXT    NOT NULL,
    fingerprint       TEXT    NOT NULL,
    token             TEXT    NOT NULL,
    state             TEXT    NOT NULL CHECK (state IN ('processing', 'completed')),
    lease_until       INTEGER NOT NULL,
    recovery_attempts INTEGER NOT NULL DEFAULT 0,
    response_status   INTEGER,
    response_body     BLOB,
    charge_id         TEXT    NOT NULL,
    created_at        INTEGER NOT NULL,
    updated_at        INTEGER NOT NULL,
    expires_at        INTEGER NOT NULL,
    PRIMARY KEY (merchant_id, key)
) STRICT;

-- Recovery looks for processing records whose lease has ended.
CREATE INDEX idempotency_keys_processing_lease
    ON idempotency_keys (lease_until) WHERE state = 'processing';

-- The sweeper deletes completed records past their expiry in batches;
-- processing records are unsettled charges and are never swept.
CREATE INDEX idempotency_keys_completed_expires_at
    ON idempotency_keys (expires_at) WHERE state = 'completed';

-- Charges have no foreign key to idempotency_keys: records expire and are
-- swept, charges are kept for good.
CREATE TABLE charges (
    id              TEXT    NOT NULL PRIMARY KEY,
    merchant_id     TEXT    NOT NULL,
    idempotency_key TEXT    NOT NULL,
    order_id        INTEGER NOT NULL,
    amount_cents    INTEGER NOT NULL,
    currency        TEXT    NOT NULL,
    payment_token   TEXT    NOT NULL,
    description     TEXT    NOT NULL DEFAULT '',
    status          TEXT    NOT NULL CHECK (status IN ('processing', 'captured', 'declined')),
    decline_code    TEXT,
    created_at      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL
) STRICT;

-- GET /v1/charges?order_id=N, newest first. The rowid every index carries
-- breaks ties between charges created in the same millisecond.
CREATE INDEX charges_merchant_order_created
    ON charges (merchant_id, order_id, created_at);
