"""Statements of the migration runner."""

__all__ = [
    "FUNCTION_AND_TRIGGER_LIST_OWN",
    "FUNCTION_DECLARED_IN_SCRATCH",
    "FUNCTION_SIGNATURE_LIST",
    "FUNCTION_SOURCE",
    "MIGRATION_CHECKSUM_FILL",
    "MIGRATION_CHECKSUM_LIST",
    "MIGRATION_LEDGER_EXISTS",
    "MIGRATION_LIST",
    "MIGRATION_LOCK",
    "MIGRATION_RECORD",
    "MIGRATION_UNLOCK",
    "TRIGGER_DEFINITION",
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

# NOTE: catalog reads of jobqueue/schema/functions.py (a handful of rows). The service's own
# functions and triggers are named sa_*; only those in the public schema count.
FUNCTION_SOURCE = """
SELECT prosrc FROM pg_proc
 WHERE proname = %(name)s AND pronamespace = 'public'::regnamespace
"""

# NOTE: every function of that name, overloads included, as Postgres prints its signature and
# its settings (proconfig, `SET name = value` of the definition), so a file's declaration can be
# compared with them in Postgres's own spelling (`timestamptz` reads `timestamp with time zone`).
FUNCTION_SIGNATURE_LIST = """
SELECT pg_get_function_arguments(p.oid) AS arguments, pg_get_function_result(p.oid) AS result,
       coalesce(p.proconfig, '{}') AS settings
  FROM pg_proc p
 WHERE p.proname = %(name)s
   AND p.pronamespace = CASE WHEN %(scratch)s THEN pg_my_temp_schema()
                             ELSE 'public'::regnamespace END
 ORDER BY 1
"""

# NOTE: inside a transaction the caller rolls back: a file's unqualified CREATE FUNCTION then
# lands in the session's temporary schema, where its signature is read and thrown away.
FUNCTION_DECLARED_IN_SCRATCH = "SET LOCAL search_path = pg_temp, public"

TRIGGER_DEFINITION = """
SELECT pg_get_triggerdef(t.oid)
  FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
 WHERE t.tgname = %(name)s AND NOT t.tgisinternal AND c.relnamespace = 'public'::regnamespace
"""

FUNCTION_AND_TRIGGER_LIST_OWN = """
SELECT proname FROM pg_proc
 WHERE pronamespace = 'public'::regnamespace AND proname LIKE 'sa\\_%%'
UNION ALL
SELECT t.tgname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
 WHERE NOT t.tgisinternal AND c.relnamespace = 'public'::regnamespace AND t.tgname LIKE 'sa\\_%%'
"""
