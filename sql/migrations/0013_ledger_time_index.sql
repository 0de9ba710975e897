-- `sa-core usage` sums the ledger over a time range, per org: BRIN indexes on created_at serve
-- that window on both the hot and the archive ledger. Ledger rows are only ever appended (and
-- moved whole to the archive), so their created_at follows their physical order, which is what
-- a BRIN index needs; it costs a few pages however large the ledger grows.
CREATE INDEX sa_ledger_created_brin ON sa_ledger USING brin (created_at);
CREATE INDEX sa_ledger_archive_created_brin ON sa_ledger_archive USING brin (created_at);
