-- 0024: the sweeper finds, for an expired authorization, whether its own
-- cancel failed (the acquirer refused the void), so that it never lists
-- that authorization again: it is an operator's (AuthorizationsExpired).
-- Failed operations are few and were in no index (charge_operations_one_live
-- holds the others); this one holds only them.
--
-- Plain CREATE INDEX takes a SHARE lock on charge_operations while it
-- builds: captures and cancels wait for the build (reads go on). On a large
-- table build it CONCURRENTLY by hand before upgrading; IF NOT EXISTS then
-- skips it.
CREATE INDEX IF NOT EXISTS charge_operations_failed
    ON charge_operations (charge_id) WHERE status = 'failed';
