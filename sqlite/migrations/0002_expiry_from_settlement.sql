-- 0002: a record expires --key-ttl after it became final, never while it is
-- processing (SPEC "Key retention"). expires_at is NULL while processing and
-- set by KeyComplete to now + the TTL.
--
-- SQLite cannot drop NOT NULL in place, so the table is rebuilt in the
-- migration's transaction (the one writer holds the lock; readers keep
-- seeing the old table until it commits). Processing records lose their
-- expiry; completed records settled after the expiry fixed at their insert
-- (settled late, by recovery) get a whole TTL from their settlement:
-- updated_at (their completion) plus the TTL they were inserted with.
CREATE TABLE idempotency_keys_0002 (
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
    -- NULL while processing: a record still owed an answer never expires.
    expires_at        INTEGER,
    PRIMARY KEY (merchant_id, key)
) STRICT;

INSERT INTO idempotency_keys_0002
SELECT merchant_id, key, fingerprint, token, state, lease_until, recovery_attempts,
       response_status, response_body, charge_id, created_at, updated_at,
       CASE
           WHEN state = 'processing' THEN NULL
           WHEN expires_at <= updated_at THEN updated_at + (expires_at - created_at)
           ELSE expires_at
       END
FROM idempotency_keys;

DROP TABLE idempotency_keys;
ALTER TABLE idempotency_keys_0002 RENAME TO idempotency_keys;

-- The indexes of 0001, on the rebuilt table.
CREATE INDEX idempotency_keys_processing_lease
    ON idempotency_keys (lease_until) WHERE state = 'processing';
CREATE INDEX idempotency_keys_completed_expires_at
    ON idempotency_keys (expires_at) WHERE state = 'completed';
