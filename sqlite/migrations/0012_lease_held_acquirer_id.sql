-- 0012: who drives a processing record, and the acquirer's own id for it
-- (mirrors the PostgreSQL migration): lease_held is 1 while an attempt,
-- recovery or a resolution drives the record, 0 once its owner let go and
-- the rest of its lease is a back-off; acquirer_id is the acquirer's own
-- object for the reference (a Stripe PaymentIntent left processing).
ALTER TABLE idempotency_keys ADD COLUMN lease_held INTEGER NOT NULL DEFAULT 1;
ALTER TABLE idempotency_keys ADD COLUMN acquirer_id TEXT;
