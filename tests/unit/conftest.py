"""Unit tests: pure logic, run without Postgres.

Every fixture that reaches the database (`pool`, `client`, `auth`, `workers`... all start from
`database_url`) fails a test here at collection, so a test that needs Postgres cannot land in
this directory by mistake: it belongs one level up, where the real database is.
"""

from __future__ import annotations

import pytest

__all__: list[str] = []

DATABASE_FIXTURE = "database_url"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Marks every test of this directory `unit`; refuses one that asks for the database."""
    for item in items:
        if "/tests/unit/" not in str(item.path):
            continue
        item.add_marker(pytest.mark.unit)
        if DATABASE_FIXTURE in getattr(item, "fixturenames", ()):
            raise pytest.UsageError(
                f"{item.nodeid} uses the database ({DATABASE_FIXTURE}); unit tests must not: "
                "move it to tests/")
