-- 0008: a charge's metadata (mirrors the PostgreSQL migration): the JSON
-- text of the client's string key-value pairs, NULL when it has none.
ALTER TABLE charges ADD COLUMN metadata TEXT;
