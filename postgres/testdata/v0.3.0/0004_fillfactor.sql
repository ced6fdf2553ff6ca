-- 0004: room on every page for the completion's update.
--
-- A charge is inserted processing and updated once, milliseconds later,
-- with its final status. None of the columns that update changes is
-- indexed, so PostgreSQL can make it a HOT update (no new index entries,
-- the new version on the same page), but only when the page has room left:
-- at the default fillfactor of 100 the page is usually full by then, and the
-- update writes a new version on another page and a new entry in both of
-- the table's indexes. The record's completion can never be HOT (it
-- changes state, which the lease index's predicate names), but room on the
-- page keeps its new version next to the old one, so it touches one page
-- instead of two.
--
-- Safe on a live database with data: SET (fillfactor) takes a SHARE UPDATE
-- EXCLUSIVE lock (reads and writes go on), rewrites nothing and applies to
-- pages filled from now on.
ALTER TABLE charges SET (fillfactor = 80);
ALTER TABLE idempotency_keys SET (fillfactor = 80);
