-- 0024: the failed operations of a charge, for the sweeper to leave out an
-- authorization whose void it tried and the acquirer refused (mirrors the
-- PostgreSQL migration).
CREATE INDEX IF NOT EXISTS charge_operations_failed ON charge_operations (charge_id) WHERE status = 'failed';
