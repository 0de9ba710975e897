"""`sa-core migrate`: refuses an install with no migration and a database whose applied files changed."""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from jobqueue.schema.migrate import MIGRATIONS, MigrationError, migrate

SHIPPED = Path(str(MIGRATIONS))


def _copy(target: Path, keep: Callable[[str], bool] = lambda name: True) -> Path:
    target.mkdir()
    for path in SHIPPED.glob("*.sql"):
        if keep(path.name):
            shutil.copy(path, target / path.name)
    return target


def _ledger(url: str) -> dict[str, str | None]:
    with psycopg.connect(url) as conn:
        return dict(conn.execute("SELECT name, checksum FROM sa_schema_migration").fetchall())


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_no_migration_found_is_refused_and_creates_nothing(empty_database: str, tmp_path: Path) -> None:
    with pytest.raises(MigrationError, match="no migration found"):
        migrate(empty_database, tmp_path)
    with psycopg.connect(empty_database) as conn:
        assert conn.execute("SELECT to_regclass('sa_schema_migration')").fetchone() == (None,)


def test_every_applied_file_has_its_checksum_recorded(empty_database: str) -> None:
    migrate(empty_database)
    assert _ledger(empty_database) == {p.stem: _sha(p) for p in SHIPPED.glob("*.sql")}


def test_a_database_migrated_before_checksums_gets_them_filled_in(
    empty_database: str, tmp_path: Path,
) -> None:
    old = _copy(tmp_path / "old", keep=lambda name: name < "0010")
    migrate(empty_database, old)
    assert migrate(empty_database) == sorted(p.stem for p in SHIPPED.glob("*.sql") if p.name >= "0010")
    assert _ledger(empty_database) == {p.stem: _sha(p) for p in SHIPPED.glob("*.sql")}


def test_a_changed_applied_file_stops_migrate_before_it_applies_anything(
    empty_database: str, tmp_path: Path,
) -> None:
    files = _copy(tmp_path / "files")
    migrate(empty_database, files)
    edited = files / "0004_idempotency.sql"
    edited.write_text(edited.read_text() + "\n-- an edit after the fact\n")
    (files / "9999_later.sql").write_text("CREATE TABLE sa_should_not_exist (id int);")

    with pytest.raises(MigrationError, match="0004_idempotency changed since it was applied"):
        migrate(empty_database, files)
    with psycopg.connect(empty_database) as conn:
        assert conn.execute("SELECT to_regclass('sa_should_not_exist')").fetchone() == (None,)
    assert "9999_later" not in _ledger(empty_database)


def test_the_cli_says_which_file_changed_in_one_line_and_exits_1(
    empty_database: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    from jobqueue.operator.cli import main

    monkeypatch.setenv("DATABASE_URL", empty_database)
    assert main(["migrate"]) == 0
    # NOTE: the database remembers another file than the one shipped, as after an edit in place.
    with psycopg.connect(empty_database, autocommit=True) as conn:
        conn.execute("UPDATE sa_schema_migration SET checksum = repeat('0', 64) "
                     "WHERE name = '0002_archive'")
    capsys.readouterr()
    assert main(["migrate"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.splitlines() == [
        "sa-core: migration 0002_archive changed since it was applied (checksum 000000000000 recorded, "
        f"{_sha(SHIPPED / '0002_archive.sql')[:12]} now); restore the file and put the change in a new "
        "migration"]
