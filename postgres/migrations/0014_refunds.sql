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
