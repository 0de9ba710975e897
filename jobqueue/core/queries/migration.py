"""Statements of the migration runner."""

__all__ = [
    "MIGRATION_CHECKSUM_FILL",
    "MIGRATION_CHECKSUM_LIST",
    "MIGRATION_LEDGER_EXISTS",
    "MIGRATION_LIST",
    "MIGRATION_LOCK",
    "MIGRATION_RECORD",
    "MIGRATION_UNLOCK",
]

# NOTE: 0001 creates the ledger table itself; before it ran, there is nothing to list.
MIGRATION_LEDGER_EXISTS = "SELECT to_regclass('sa_schema_migration') IS NOT NULL"

# NOTE: the ledger holds one row per migration (tens); a sequential scan is the plan.
MIGRATION_LIST = "SELECT name FROM sa_schema_migration"

MIGRATION_RECORD = "INSERT INTO sa_schema_migration (name) VALUES (%s)"

# NOTE: the checksum column exists once 0010_migration_checksum ran; the runner only uses these
# two statements after that.
MIGRATION_CHECKSUM_LIST = "SELECT name, checksum FROM sa_schema_migration"

# NOTE: served by the primary key (name); fills only rows recorded without a checksum, so a
# recorded checksum is never overwritten.
MIGRATION_CHECKSUM_FILL = (
    "UPDATE sa_schema_migration SET checksum = %(checksum)s WHERE name = %(name)s AND checksum IS NULL"
)

# NOTE: a fixed key ('sa-core migrate'), shared by every process that may migrate.
MIGRATION_LOCK = "SELECT pg_advisory_lock(hashtext('sa-core migrate'))"
MIGRATION_UNLOCK = "SELECT pg_advisory_unlock(hashtext('sa-core migrate'))"
