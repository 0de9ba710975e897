"""Server-level statements: create and drop whole databases (dev server and test runs), and the
session's own settings."""

from psycopg import sql

__all__ = ["DATABASE_CREATE", "DATABASE_DROP", "DATABASE_EXISTS", "SESSION_TIMEOUTS"]

DATABASE_EXISTS = "SELECT 1 FROM pg_database WHERE datname = %s"

# NOTE: identifiers cannot be bound as parameters; sql.Identifier quotes them instead.
DATABASE_CREATE = sql.SQL("CREATE DATABASE {}")
DATABASE_DROP = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")

# NOTE: reads the session's settings, no table: what the server applies to this role and database
# when no startup option set them (behind a pooler; ops/README.md, PgBouncer).
SESSION_TIMEOUTS = """
SELECT current_setting('statement_timeout') AS statement_timeout,
       current_setting('lock_timeout') AS lock_timeout
"""
