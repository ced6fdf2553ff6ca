-- 0009: a charge's history off the common path, and the operators' audit
-- trail (mirrors the PostgreSQL migration). The common path writes nothing
-- here; its history is derived from the charge's row. Times are unix µs.
-- Append-only: triggers refuse UPDATE and DELETE.

CREATE TABLE charge_history (
    id          INTEGER NOT NULL PRIMARY KEY,
    charge_id   TEXT    NOT NULL,
    merchant_id TEXT    NOT NULL,
    at          INTEGER NOT NULL,
    kind        TEXT    NOT NULL,
    actor       TEXT    NOT NULL,
    outcome     TEXT    NOT NULL DEFAULT '',
    detail      TEXT    NOT NULL DEFAULT '',
    reason      TEXT    NOT NULL DEFAULT '',
    forced      INTEGER NOT NULL DEFAULT 0
) STRICT;

CREATE INDEX charge_history_charge ON charge_history (charge_id, id);

CREATE INDEX charge_history_resolution ON charge_history (id) WHERE kind = 'resolution';

CREATE TRIGGER charge_history_no_update
BEFORE UPDATE ON charge_history
BEGIN
    SELECT RAISE(ABORT, 'charge_history is append-only');
END;

CREATE TRIGGER charge_history_no_delete
BEFORE DELETE ON charge_history
BEGIN
    SELECT RAISE(ABORT, 'charge_history is append-only');
END;
