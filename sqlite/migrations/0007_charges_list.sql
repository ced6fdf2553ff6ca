-- 0007: GET /v1/charges pages through a merchant's charges, newest first, by
-- a keyset on (created_at, id), optionally for one order and one status
-- (mirrors the PostgreSQL migration). One stretch of the index per status:
-- a page is a UNION ALL of one range scan per status, each stopping after
-- one page. The index with order_id also serves ChargesListByOrder, so it
-- replaces the index of 0001.
CREATE INDEX IF NOT EXISTS charges_merchant_status_created
    ON charges (merchant_id, status, created_at, id);

CREATE INDEX IF NOT EXISTS charges_merchant_order_status_created
    ON charges (merchant_id, order_id, status, created_at, id);

DROP INDEX IF EXISTS charges_merchant_order_created;
