-- 0020: reconciliation reads refunds, sends an event and keeps
-- acknowledgements (SPEC "Reconciliation (v4)").
--
-- Expand-only: a new index on refunds, new tables. The previous release
-- neither reads nor writes them.
--
-- Online: CREATE INDEX holds SHARE on refunds while it builds, so refunds
-- (not charges) wait for the build; on a large refunds table build it
-- CONCURRENTLY by hand before upgrading, and IF NOT EXISTS skips it.

-- chargeonce:step
-- Reconciliation reads a period's refunds in the acquirer ledger's order,
-- by the charge they refund, keyset-paged.
CREATE INDEX IF NOT EXISTS refunds_charge_reference ON refunds (charge_id, id);

-- chargeonce:step
-- Each merchant's share of a run (what its reconciliation.completed event
-- carries), replaced by a re-run like the run. id names it as an event's
-- object: derived from (acquirer, period, merchant), so the event, whose id
-- is derived from it, is written once per run and merchant, by the
-- statement that first stores the share (ON CONFLICT DO NOTHING).
CREATE TABLE IF NOT EXISTS recon_run_merchants (
    acquirer    text        NOT NULL,
    period      text        NOT NULL,
    merchant_id text        NOT NULL,
    id          text        NOT NULL UNIQUE,
    charges     integer     NOT NULL,
    refunds     integer     NOT NULL,
    matched     integer     NOT NULL,
    counts      text        NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (acquirer, period, merchant_id)
);

-- chargeonce:step
-- An operator's acknowledgement of one exception of a run: who, when, and
-- why. Append-only, one per exception (a second acknowledgement is
-- refused); it outlives re-runs of the period, which find the same
-- exception under the same key.
CREATE TABLE IF NOT EXISTS recon_acks (
    acquirer         text        NOT NULL,
    period           text        NOT NULL,
    type             text        NOT NULL,
    reference        text        NOT NULL,
    object_reference text        NOT NULL DEFAULT '',
    actor            text        NOT NULL,
    note             text        NOT NULL,
    at               timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (acquirer, period, type, reference, object_reference)
);
