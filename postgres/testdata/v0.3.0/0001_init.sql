-- Objects are created unqualified, so they land in the first schema of the
-- connection's search_path (tests give every store a schema of its own).

-- One row per (merchant, Idempotency-Key): the record the whole protocol
-- hangs on. The primary key is what makes INSERT ... ON CONFLICT DO NOTHING
-- decide, with no window, which attempt is first.
CREATE TABLE idempotency_keys (
    merchant_id       text        NOT NULL,
    key               text        NOT NULL,
    fingerprint       text        NOT NULL,
    -- The owning attempt's token; completing is a compare-and-set on it.
    token             text        NOT NULL,
    state             text        NOT NULL CHECK (state IN ('processing', 'completed')),
    lease_until       timestamptz NOT NULL,
    recovery_attempts integer     NOT NULL DEFAULT 0,
    response_status   integer,
    response_body     bytea,
    -- No foreign key: the sweeper deletes records, never charges.
    charge_id         text        NOT NULL,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    expires_at        timestamptz NOT NULL,
    PRIMARY KEY (merchant_id, key)
);

-- Recovery scans processing records by lease end; completed records, the
-- vast majority, stay out of this index.
CREATE INDEX idempotency_keys_lease_until_idx
    ON idempotency_keys (lease_until) WHERE state = 'processing';

-- The sweeper deletes by expiry.
CREATE INDEX idempotency_keys_expires_at_idx ON idempotency_keys (expires_at);

-- Charges outlive their idempotency records: they are never deleted.
CREATE TABLE charges (
    id              text        PRIMARY KEY,
    merchant_id     text        NOT NULL,
    idempotency_key text        NOT NULL,
    order_id        bigint      NOT NULL,
    amount_cents    bigint      NOT NULL,
    currency        text        NOT NULL,
    payment_token   text        NOT NULL,
    description     text        NOT NULL DEFAULT '',
    status          text        NOT NULL CHECK (status IN ('processing', 'captured', 'declined')),
    decline_code    text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now()
);

-- GET /v1/charges?order_id=N, newest first: how operators look for doubles.
CREATE INDEX charges_merchant_order_idx
    ON charges (merchant_id, order_id, created_at DESC);
