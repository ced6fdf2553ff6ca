-- 0016: stored reconciliation runs (SPEC "Reconciliation (v4)").
--
-- One row per (acquirer, period): re-running a day replaces its report and
-- counts one more run, so a day never has two runs that disagree. Counts
-- (mismatches by type) and the report are JSON text, written whole by
-- ReconRunSave.
--
-- Online: a new table, nothing else is touched; no lock on charges.

-- chargeonce:step
CREATE TABLE IF NOT EXISTS recon_runs (
    acquirer   text        NOT NULL,
    period     text        NOT NULL,
    period_from timestamptz NOT NULL,
    period_to  timestamptz NOT NULL,
    counts     text        NOT NULL,
    report     bytea       NOT NULL,
    runs       integer     NOT NULL DEFAULT 1,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (acquirer, period)
);
