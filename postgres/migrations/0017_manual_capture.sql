-- 0017: manual capture and void (SPEC "Money going back").
--
-- A charge asked with capture_method "manual" is only authorized: it ends
-- its first drive "authorized" (or declined), and a capture or a cancel
-- (void) settles it later as "captured" or "canceled". Both are money
-- operations with the charge protocol: each is guarded by a row of
-- idempotency_keys whose charge_id column holds the operation's id (cap_…
-- or cnl_…), like a refund's, and the operation's row in charge_operations
-- is its acquirer reference.
--
-- The database decides who wins: the partial unique index
-- charge_operations_one_live keeps at most one capture or cancel of a
-- charge pending or succeeded, whatever the concurrency (one that failed
-- frees the charge for another), and the statement that inserts an
-- operation requires its charge authorized and its amount within the
-- authorized one (charges_captured_cents_check stands behind it).
--
-- captured_cents is what a manual capture took (NULL for an automatic
-- charge, whose captured amount is amount_cents); refunds are bounded by
-- the captured amount (charges_refunded_captured_check), 0014's CHECK
-- against amount_cents staying true beside it.
--
-- Events: charge.captured when an authorization is captured and
-- charge.canceled when it is voided, by the statement that settles it (the
-- trigger function below); an authorization itself records no event.
--
-- Online: nullable columns (catalog only); CHECKs added NOT VALID (brief
-- lock, no scan) then validated under SHARE UPDATE EXCLUSIVE; the old
-- status CHECK is dropped only after its wider twin is valid, so the
-- previous release (which never writes the new statuses) is unaffected. The
-- partial index on authorized charges (the sweeper's expiry scan) holds no
-- entry for an automatic charge; on a large charges table build it
-- CONCURRENTLY by hand before upgrading, and IF NOT EXISTS skips it.

-- chargeonce:step
ALTER TABLE charges ADD COLUMN IF NOT EXISTS capture_method text;

-- chargeonce:step
ALTER TABLE charges ADD COLUMN IF NOT EXISTS captured_cents bigint;

-- chargeonce:step
ALTER TABLE charges ADD CONSTRAINT charges_status_check_v2
    CHECK (status IN ('processing', 'authorized', 'captured', 'declined', 'canceled')) NOT VALID;

-- chargeonce:step
ALTER TABLE charges VALIDATE CONSTRAINT charges_status_check_v2;

-- chargeonce:step
ALTER TABLE charges DROP CONSTRAINT IF EXISTS charges_status_check;

-- chargeonce:step
ALTER TABLE charges ADD CONSTRAINT charges_capture_method_check
    CHECK (capture_method IS NULL OR capture_method = 'manual') NOT VALID;

-- chargeonce:step
ALTER TABLE charges VALIDATE CONSTRAINT charges_capture_method_check;

-- chargeonce:step
ALTER TABLE charges ADD CONSTRAINT charges_captured_cents_check
    CHECK (captured_cents IS NULL OR (captured_cents > 0 AND captured_cents <= amount_cents)) NOT VALID;

-- chargeonce:step
ALTER TABLE charges VALIDATE CONSTRAINT charges_captured_cents_check;

-- chargeonce:step
ALTER TABLE charges ADD CONSTRAINT charges_refunded_captured_check
    CHECK (refunded_cents <= COALESCE(captured_cents, amount_cents)) NOT VALID;

-- chargeonce:step
ALTER TABLE charges VALIDATE CONSTRAINT charges_refunded_captured_check;

-- chargeonce:step
-- The sweeper's scan for authorizations past their time to live.
CREATE INDEX IF NOT EXISTS charges_authorized_created_idx
    ON charges (created_at) WHERE status = 'authorized';

-- chargeonce:step
-- Captures and cancels are never deleted, like charges; their records expire.
CREATE TABLE IF NOT EXISTS charge_operations (
    id              text        PRIMARY KEY,
    merchant_id     text        NOT NULL,
    idempotency_key text        NOT NULL,
    charge_id       text        NOT NULL,
    kind            text        NOT NULL CHECK (kind IN ('capture', 'cancel')),
    amount_cents    bigint      NOT NULL CHECK (amount_cents > 0),
    currency        text        NOT NULL,
    status          text        NOT NULL CHECK (status IN ('pending', 'succeeded', 'failed')),
    failure_reason  text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now()
);

-- chargeonce:step
CREATE UNIQUE INDEX IF NOT EXISTS charge_operations_one_live
    ON charge_operations (charge_id) WHERE status <> 'failed';

-- chargeonce:step
CREATE OR REPLACE FUNCTION charges_settlement_events() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO webhook_events (id, merchant_id, charge_id, type)
    SELECT 'evt_' || substr(n.id, 4), n.merchant_id, n.id, 'charge.' || n.status
    FROM settled_new n
    JOIN settled_old o ON o.id = n.id
    WHERE (o.status = 'processing' AND n.status IN ('captured', 'declined'))
       OR (o.status = 'authorized' AND n.status IN ('captured', 'canceled'))
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END
$$;
