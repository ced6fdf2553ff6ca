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
