-- 0020: reconciliation reads refunds, sends an event and keeps
-- acknowledgements (mirrors the PostgreSQL migration).

-- Reconciliation reads a period's refunds in the acquirer ledger's order,
-- by the charge they refund, keyset-paged.
CREATE INDEX IF NOT EXISTS refunds_charge_reference ON refunds (charge_id, id);

-- Each merchant's share of a run, what its reconciliation.completed event
-- carries; see the PostgreSQL migration.
CREATE TABLE IF NOT EXISTS recon_run_merchants (
    acquirer    TEXT    NOT NULL,
    period      TEXT    NOT NULL,
    merchant_id TEXT    NOT NULL,
    id          TEXT    NOT NULL UNIQUE,
    charges     INTEGER NOT NULL,
    refunds     INTEGER NOT NULL,
    matched     INTEGER NOT NULL,
    counts      TEXT    NOT NULL,
    created_at  INTEGER NOT NULL,
    updated_at  INTEGER NOT NULL,
    PRIMARY KEY (acquirer, period, merchant_id)
) STRICT;

-- An operator's acknowledgement of one exception of a run (see the
-- PostgreSQL migration).
CREATE TABLE IF NOT EXISTS recon_acks (
    acquirer         TEXT    NOT NULL,
    period           TEXT    NOT NULL,
    type             TEXT    NOT NULL,
    reference        TEXT    NOT NULL,
    object_reference TEXT    NOT NULL DEFAULT '',
    actor            TEXT    NOT NULL,
    note             TEXT    NOT NULL,
    at               INTEGER NOT NULL,
    PRIMARY KEY (acquirer, period, type, reference, object_reference)
) STRICT;
