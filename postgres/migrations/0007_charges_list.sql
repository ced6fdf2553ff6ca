-- 0007: GET /v1/charges pages through a merchant's charges (SPEC "GET
-- /v1/charges"), newest first, by a keyset on (created_at, id), optionally
-- for one order and one status.
--
-- Each status gets its own stretch of the index, so a page is a UNION ALL of
-- one range scan per status (ChargesList), each stopping after one page:
-- the status filter, and the list with no filter, read at most a few pages
-- of entries whatever the merchant has stored. The index with order_id
-- serves the order filter and also ChargesListByOrder, so it replaces the
-- index of 0001.
--
-- Cost on the write path: status is now an indexed column, so the update
-- that settles a charge is no longer a HOT update (0004): it adds entries
-- to the charge's indexes.
--
-- Plain CREATE INDEX takes a SHARE lock on charges while it builds: writes
-- wait for the build (reads go on). On a large table build the indexes
-- CONCURRENTLY by hand before upgrading; IF NOT EXISTS then skips them.
--
-- Each statement is a step of its own: in one transaction, the SHARE lock of
-- CREATE INDEX was held while DROP INDEX asked for ACCESS EXCLUSIVE on the
-- same table, and a request that had read charges and then wrote it closed a
-- cycle (deadlock detected, 40P01, seen under a rolling upgrade's load).

-- chargeonce:step
CREATE INDEX IF NOT EXISTS charges_merchant_status_created_idx
    ON charges (merchant_id, status, created_at DESC, id DESC);

-- chargeonce:step
CREATE INDEX IF NOT EXISTS charges_merchant_order_status_created_idx
    ON charges (merchant_id, order_id, status, created_at DESC, id DESC);

-- chargeonce:step
DROP INDEX IF EXISTS charges_merchant_order_idx;
