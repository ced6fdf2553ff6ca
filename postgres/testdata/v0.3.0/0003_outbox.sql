-- 0003_outbox: the transactional outbox of queue results.
--
-- A queue message whose outcome is still unknown (the engine answered 202)
-- sets notify on its record. Whoever completes the record later (recovery in
-- any instance, a retry over HTTP or the queue) runs the usual UPDATE; the
-- trigger below then writes the final answer to outbox in that same
-- statement, so the result can never be lost between the database and the
-- stream. Publishers (every `chargeonce worker`) drain outbox and delete a row
-- once JetStream has acknowledged it.

ALTER TABLE idempotency_keys ADD COLUMN notify boolean NOT NULL DEFAULT false;

CREATE TABLE outbox (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    merchant_id     text        NOT NULL,
    key             text        NOT NULL,
    response_status integer     NOT NULL,
    response_body   bytea       NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    -- A publisher holds a row until claimed_until; after that another may
    -- take it (the first one died before marking it sent).
    claimed_until   timestamptz NOT NULL DEFAULT '-infinity'
);

CREATE INDEX outbox_claimed_until_idx ON outbox (claimed_until, id);

-- The function is pinned to the migration's search_path, so the outbox it
-- writes is the one next to the record, whatever the session's path.
CREATE FUNCTION outbox_enqueue() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO outbox (merchant_id, key, response_status, response_body)
    VALUES (NEW.merchant_id, NEW.key, NEW.response_status, NEW.response_body);
    RETURN NULL;
END
$$;

CREATE TRIGGER idempotency_keys_outbox
AFTER UPDATE ON idempotency_keys
FOR EACH ROW
WHEN (NEW.notify AND NEW.state = 'completed' AND OLD.state = 'processing')
EXECUTE FUNCTION outbox_enqueue();
