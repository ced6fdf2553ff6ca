-- 0015: the audit trail lists refused resolutions beside the resolutions
-- (see the PostgreSQL store's 0015). AuditList reads both kinds newest first
-- by this partial index.

CREATE INDEX IF NOT EXISTS charge_history_audit ON charge_history (id)
    WHERE kind IN ('resolution', 'resolve-refused');
