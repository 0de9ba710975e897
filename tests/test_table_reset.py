"""Every test starts from empty tables: the reset between tests reaches every table the
migrations create, so no test counts another's rows (an unlogged table has no foreign key to
be reached by, and was missed once)."""

from __future__ import annotations

from psycopg_pool import ConnectionPool

from jobqueue.core.db import DictConnection
from tests.helpers import TableReset, fetch_all

TABLES_IN_SCHEMA = """
SELECT c.relname AS name
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p')
"""


def test_the_reset_between_tests_reaches_every_table_but_the_migrations_ledger(
        _table_reset: TableReset, pool: ConnectionPool[DictConnection]) -> None:
    tables = {row["name"] for row in fetch_all(pool, TABLES_IN_SCHEMA)}
    assert _table_reset.reached() == tables - {"sa_schema_migration"}
