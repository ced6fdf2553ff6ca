-- 0021: a merchant's share of a reconciliation run counts its captures and
-- cancels of authorizations (recon_run_merchants.operations), as it counts
-- its charges and refunds; reconciliation.completed carries it.
--
-- Expand only: a NOT NULL column with a constant default is a catalog
-- change (an instant's ACCESS EXCLUSIVE, no rewrite). The previous release
-- does not write it: its runs' shares read 0.

-- chargeonce:step
ALTER TABLE recon_run_merchants ADD COLUMN IF NOT EXISTS operations integer NOT NULL DEFAULT 0;
