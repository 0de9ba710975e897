-- Each applied migration keeps the SHA-256 of the file as it was applied, so `sa-core migrate`
-- refuses to go on when an applied file was edited afterwards (a change must be a new migration).
-- NULL for rows recorded before this column existed: the runner fills them in, from the files it
-- ships, in the same run that applies this migration.
ALTER TABLE sa_schema_migration ADD COLUMN checksum text;
