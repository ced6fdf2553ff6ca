-- 0015: the audit trail lists refused resolutions beside the resolutions
-- (an operator's decision the acquirer contradicted, or could not confirm,
-- was only in the charge's own history). AuditList reads both kinds newest
-- first, by this partial index; 0009's index of resolutions alone is left
-- for a later release to drop (expand/contract: the previous release still
-- reads with it).
--
-- charge_history is written only off the common path, and CREATE INDEX
-- takes a SHARE lock on it while it builds (writes of history wait, reads go
-- on). On a large table build it CONCURRENTLY by hand before upgrading; IF
-- NOT EXISTS then skips it.

-- chargeonce:step
CREATE INDEX IF NOT EXISTS charge_history_audit_idx ON charge_history (id)
    WHERE kind IN ('resolution', 'resolve-refused');
