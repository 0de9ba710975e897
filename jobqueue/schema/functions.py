"""Today's definition of every database function and trigger, one file each in sql/functions/.

Migrations that created or replaced a function keep their text (they are checksummed), so the
current body of a function used to exist only as the last migration that restated it. Each
`sql/functions/NAME.sql` now holds function NAME (`CREATE OR REPLACE FUNCTION NAME ... AS $$
... $$`) and the triggers that call it (`CREATE OR REPLACE TRIGGER ...`, written as
`pg_get_triggerdef` prints them). `sa-core migrate` applies, after the migrations, each file the
database differs from; `drift` says which ones differ, so a test can hold the database to the
tree.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable

import psycopg

from jobqueue.core.queries import migration as q

__all__ = ["FUNCTIONS", "Definition", "drift", "load_definitions", "undeclared"]

FUNCTIONS: Traversable = resources.files("jobqueue") / "sql" / "functions"
"""The definitions shipped inside the package."""

_FUNCTION = re.compile(r"CREATE OR REPLACE FUNCTION (\w+)\(.*?\$\$(.*?)\$\$;", re.DOTALL)
_TRIGGER = re.compile(r"CREATE OR REPLACE TRIGGER (\w+) (.*?);")
_NAME = re.compile(r"^[a-z0-9_]+\.sql$")


@dataclass(frozen=True, slots=True)
class Definition:
    """One shipped file: its function's body as Postgres stores it (prosrc) and its triggers."""

    name: str
    sql: str
    body: str
    triggers: dict[str, str]


def load_definitions(directory: Traversable = FUNCTIONS) -> list[Definition]:
    """Reads every `NAME.sql` of `directory`, in name order.

    Raises:
        ValueError: a file does not define function NAME exactly once.
    """
    found = []
    for entry in sorted((e for e in directory.iterdir() if _NAME.match(e.name)),
                        key=lambda e: e.name):
        text = entry.read_text()
        name = entry.name.removesuffix(".sql")
        functions = _FUNCTION.findall(text)
        if [fn for fn, _ in functions] != [name]:
            raise ValueError(f"sql/functions/{entry.name} must define function {name} once")
        triggers = {trigger: f"CREATE TRIGGER {trigger} {rest}"
                    for trigger, rest in _TRIGGER.findall(text)}
        found.append(Definition(name, text, functions[0][1], triggers))
    return found


def drift(conn: psycopg.Connection[tuple[object, ...]],
          definitions: list[Definition]) -> list[Definition]:
    """Returns the definitions the database does not hold exactly (body or a trigger differs)."""
    stale = []
    for definition in definitions:
        row = conn.execute(q.FUNCTION_SOURCE, {"name": definition.name}).fetchone()
        same = row is not None and row[0] == definition.body
        for trigger, expected in definition.triggers.items():
            found = conn.execute(q.TRIGGER_DEFINITION, {"name": trigger}).fetchone()
            same = same and found is not None and found[0] == expected
        if not same:
            stale.append(definition)
    return stale


def undeclared(conn: psycopg.Connection[tuple[object, ...]],
               definitions: list[Definition]) -> list[str]:
    """Returns the service's functions and triggers in the database that no file declares."""
    declared = {d.name for d in definitions} | {t for d in definitions for t in d.triggers}
    present = [str(row[0]) for row in conn.execute(q.FUNCTION_AND_TRIGGER_LIST_OWN).fetchall()]
    return sorted(name for name in present if name not in declared)
