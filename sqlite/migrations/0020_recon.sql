-- 0020: reconciliation reads refunds, sends an event and keeps
-- acknowledgements (mirrors the PostgreSQL migration).

-- Reconciliation reads a period's refunds in the acquirer ledger's order,
-- by the charge they refund, keyset-paged.
CREATE INDEX IF NOT EXISTS refunds_charge_reference ON refunds (charge_id, id);
