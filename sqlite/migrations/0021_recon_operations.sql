-- 0021: a merchant's share of a reconciliation run counts its captures and
-- cancels of authorizations (mirrors the PostgreSQL migration).
ALTER TABLE recon_run_merchants ADD COLUMN operations INTEGER NOT NULL DEFAULT 0;
