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
