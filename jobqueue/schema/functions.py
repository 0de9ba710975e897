"""Today's definition of every database function and trigger, one file each in sql/functions/.

Migrations that created or replaced a function keep their text (they are checksummed), so the
current body of a function used to exist only as the last migration that restated it. Each
`sql/functions/NAME.sql` now holds function NAME (`CREATE OR REPLACE FUNCTION NAME ... AS $$
... $$`) and the triggers that call it (`CREATE OR REPLACE TRIGGER ...`, written as
`pg_get_triggerdef` prints them). `sa-core migrate` applies, after the migrations, each file the
database differs from; `drift` says which ones differ (body, settings, triggers) and
`signature_drift` which functions' arguments or result type differ (a CREATE OR REPLACE cannot
change those: a migration must drop the old one), so a test can hold the database to the tree.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable

import psycopg

from jobqueue.core.queries import migration as q

__all__ = ["FUNCTIONS", "Definition", "Signature", "drift", "load_definitions", "signature_drift",
           "undeclared"]

FUNCTIONS: Traversable = resources.files("jobqueue") / "sql" / "functions"
"""The definitions shipped inside the package."""

_FUNCTION = re.compile(r"(CREATE OR REPLACE FUNCTION (\w+)\(.*?\$\$(.*?)\$\$;)", re.DOTALL)
_TRIGGER = re.compile(r"CREATE OR REPLACE TRIGGER (\w+) (.*?);")
_NAME = re.compile(r"^[a-z0-9_]+\.sql$")


@dataclass(frozen=True, slots=True)
class Definition:
    """One shipped file: its function's body as Postgres stores it (prosrc) and its triggers."""

    name: str
    sql: str
    body: str
    triggers: dict[str, str]
    function: str
    """The file's CREATE FUNCTION statement alone (no trigger), to read what it declares."""


@dataclass(frozen=True, slots=True)
class Signature:
    """A function's arguments, result type and settings, as Postgres prints them."""

    arguments: str
    result: str
    settings: tuple[str, ...]


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
        if [fn for _, fn, _ in functions] != [name]:
            raise ValueError(f"sql/functions/{entry.name} must define function {name} once")
        triggers = {trigger: f"CREATE TRIGGER {trigger} {rest}"
                    for trigger, rest in _TRIGGER.findall(text)}
        statement, _, body = functions[0]
        found.append(Definition(name, text, body, triggers, statement))
    return found


def drift(conn: psycopg.Connection[tuple[object, ...]],
          definitions: list[Definition]) -> list[Definition]:
    """Returns the definitions the database does not hold exactly (body, settings or a trigger
    differs): the ones `sa-core migrate` applies again."""
    stale = []
    for definition in definitions:
        row = conn.execute(q.FUNCTION_SOURCE, {"name": definition.name}).fetchone()
        same = row is not None and row[0] == definition.body
        declared = _declared(conn, definition)
        # NOTE: settings of the declared signature only; another signature is signature_drift's.
        same = same and all(s.settings == declared.settings
                            for s in _present(conn, definition.name)
                            if (s.arguments, s.result) == (declared.arguments, declared.result))
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


def signature_drift(conn: psycopg.Connection[tuple[object, ...]],
                    definitions: list[Definition]) -> list[str]:
    """Names the functions whose signatures in the database are not exactly the one their file
    declares: other arguments or result type, an extra overload, or none at all."""
    stale = []
    for definition in definitions:
        declared = _declared(conn, definition)
        present = [(s.arguments, s.result) for s in _present(conn, definition.name)]
        if present != [(declared.arguments, declared.result)]:
            stale.append(definition.name)
    return stale


def _present(conn: psycopg.Connection[tuple[object, ...]], name: str, *,
             scratch: bool = False) -> list[Signature]:
    found = []
    for arguments, result, settings in conn.execute(
            q.FUNCTION_SIGNATURE_LIST, {"name": name, "scratch": scratch}).fetchall():
        assert isinstance(settings, list)
        found.append(Signature(str(arguments), str(result), tuple(map(str, settings))))
    return found


def _declared(conn: psycopg.Connection[tuple[object, ...]], definition: Definition) -> Signature:
    """What the file declares, in Postgres's spelling: its CREATE FUNCTION run in the session's
    temporary schema, read, and rolled back."""
    with conn.transaction(force_rollback=True):
        conn.execute(q.FUNCTION_DECLARED_IN_SCRATCH)
        conn.execute(definition.function.encode())
        found = _present(conn, definition.name, scratch=True)
    if len(found) != 1:
        raise ValueError(f"sql/functions/{definition.name}.sql declares no single function")
    return found[0]
