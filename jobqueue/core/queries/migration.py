"""Statements of the migration runner."""

__all__ = [
    "MIGRATION_LEDGER_EXISTS",
    "MIGRATION_LIST",
    "MIGRATION_LOCK",
    "MIGRATION_RECORD",
    "MIGRATION_UNLOCK",
]

# NOTE: 0001 creates the ledger table itself; before it ran, there is nothing to list.
MIGRATION_LEDGER_EXISTS = "SELECT to_regclass('sa_schema_migration') IS NOT NULL"

MIGRATION_LIST = "SELECT name FROM sa_schema_migration"

MIGRATION_RECORD = "INSERT INTO sa_schema_migration (name) VALUES (%s)"

# NOTE: a fixed key ('sa-core migrate'), shared by every process that may migrate.
MIGRATION_LOCK = "SELECT pg_advisory_lock(hashtext('sa-core migrate'))"
MIGRATION_UNLOCK = "SELECT pg_advisory_unlock(hashtext('sa-core migrate'))"
