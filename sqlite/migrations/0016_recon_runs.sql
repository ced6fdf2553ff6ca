-- 0016: stored reconciliation runs (mirrors the PostgreSQL migration): one
-- row per (acquirer, period), replaced by a re-run, which counts one more
-- run. Times are microseconds since the epoch, as everywhere in this store.
CREATE TABLE IF NOT EXISTS recon_runs (
    acquirer    TEXT    NOT NULL,
    period      TEXT    NOT NULL,
    period_from INTEGER NOT NULL,
    period_to   INTEGER NOT NULL,
    counts      TEXT    NOT NULL,
    report      BLOB    NOT NULL,
    runs        INTEGER NOT NULL DEFAULT 1,
    created_at  INTEGER NOT NULL,
    updated_at  INTEGER NOT NULL,
    PRIMARY KEY (acquirer, period)
) STRICT;
