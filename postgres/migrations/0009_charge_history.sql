-- 0009: a charge's history off the common path, and the operators' audit
-- trail (SPEC "Operators: stuck charges, history, resolution").
--
-- The common path (insert, capture, settle) writes nothing here: its
-- history is derived from the charge's own row (created_at, status,
-- updated_at). Rows are appended only where something unusual happens: a
-- capture whose outcome was unknown, a lookup, recovery taking a record
-- over, an operator's resolution (the audit entry: who, when, why, what
-- the acquirer said) or a resolution refused.
--
-- Append-only: a trigger refuses UPDATE, DELETE and TRUNCATE, so an audit
-- entry cannot be rewritten through the service's own connection.
--
-- Online: a new table, its indexes and its triggers lock nothing the
-- previous release uses; each step runs with a lock timeout.

-- chargeonce:step
CREATE TABLE charge_history (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    charge_id   text        NOT NULL,
    merchant_id text        NOT NULL,
    at          timestamptz NOT NULL DEFAULT now(),
    kind        text        NOT NULL,
    actor       text        NOT NULL,
    outcome     text        NOT NULL DEFAULT '',
    detail      text        NOT NULL DEFAULT '',
    reason      text        NOT NULL DEFAULT '',
    forced      boolean     NOT NULL DEFAULT false
);

-- A charge's timeline, and the newest entry of each stuck charge.
CREATE INDEX charge_history_charge_idx ON charge_history (charge_id, id);

-- The audit trail: resolutions, newest first.
CREATE INDEX charge_history_resolution_idx ON charge_history (id) WHERE kind = 'resolution';

CREATE FUNCTION charge_history_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'charge_history is append-only';
END
$$;

-- chargeonce:step
CREATE TRIGGER charge_history_no_update
BEFORE UPDATE OR DELETE ON charge_history
FOR EACH ROW EXECUTE FUNCTION charge_history_append_only();

-- chargeonce:step
CREATE TRIGGER charge_history_no_truncate
BEFORE TRUNCATE ON charge_history
FOR EACH STATEMENT EXECUTE FUNCTION charge_history_append_only();
