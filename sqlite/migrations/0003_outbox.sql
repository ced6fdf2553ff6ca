-- 0003_outbox: the transactional outbox of queue results (mirrors the
-- PostgreSQL migration).
--
-- A queue message whose outcome is still unknown (the engine answered 202)
-- sets notify on its record. Whoever completes the record later runs the
-- usual UPDATE; the trigger then writes the final answer to outbox inside
-- that same transaction, so the result can never be lost between the
-- database and the stream. Publishers delete a row once JetStream has
-- acknowledged it.

ALTER TABLE idempotency_keys ADD COLUMN notify INTEGER NOT NULL DEFAULT 0;

CREATE TABLE outbox (
    id              INTEGER NOT NULL PRIMARY KEY,
    merchant_id     TEXT    NOT NULL,
    key             TEXT    NOT NULL,
    response_status INTEGER NOT NULL,
    response_body   BLOB    NOT NULL,
    created_at      INTEGER NOT NULL,
    -- A publisher holds a row until claimed_until (unix µs); after that
    -- another may take it.
    claimed_until   INTEGER NOT NULL DEFAULT 0
) STRICT;

CREATE INDEX outbox_claimed_until ON outbox (claimed_until, id);

CREATE TRIGGER idempotency_keys_outbox
AFTER UPDATE OF state ON idempotency_keys
FOR EACH ROW
WHEN NEW.notify = 1 AND NEW.state = 'completed' AND OLD.state = 'processing'
BEGIN
    INSERT INTO outbox (merchant_id, key, response_status, response_body, created_at)
    VALUES (NEW.merchant_id, NEW.key, NEW.response_status, NEW.response_body,
            CAST(ROUND(unixepoch('subsec') * 1000) AS INTEGER) * 1000);
END;
