-- 0012: who drives a processing record, and the acquirer's own id for it
-- (SPEC "Operators" and "Acquirers").
--
-- lease_held is true while an attempt, recovery or a resolution drives the
-- record under its lease, and false once its owner let go (KeyLeaseSet):
-- the rest of the lease is then a back-off. An operator's resolution never
-- takes a record whose lease is held and running; it may take one in
-- back-off. acquirer_id keeps the acquirer's own object for the reference
-- (a Stripe PaymentIntent left processing), so lookups retrieve it rather
-- than search.
--
-- Online: new columns with a constant default or none only change the
-- catalog (no table rewrite, a brief lock). A release before this one
-- neither sets nor reads them: its claims leave lease_held as it was, so
-- during an upgrade a record it drives may look released; the resolution's
-- lookup (under way, unsure) still refuses to settle it without force.

-- chargeonce:step
ALTER TABLE idempotency_keys ADD COLUMN lease_held boolean NOT NULL DEFAULT true;

-- chargeonce:step
ALTER TABLE idempotency_keys ADD COLUMN acquirer_id text;
