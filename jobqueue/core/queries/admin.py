"""Server-level statements: create and drop whole databases (dev server and test runs)."""

from psycopg import sql

__all__ = ["DATABASE_CREATE", "DATABASE_DROP", "DATABASE_EXISTS"]

DATABASE_EXISTS = "SELECT 1 FROM pg_database WHERE datname = %s"

# NOTE: identifiers cannot be bound as parameters; sql.Identifier quotes them instead.
DATABASE_CREATE = sql.SQL("CREATE DATABASE {}")
DATABASE_DROP = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
